package k8s

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// DefaultSettle is how long a file written in place must go unwritten
// before WatchDir reads it, when WatchDir is given no settle time.
const DefaultSettle = 50 * time.Millisecond

// KindManifestFile labels a manifest file that can't be read or decoded
// when it is counted with the invalid objects (TrackerOptions.OnInvalid).
const KindManifestFile = "ManifestFile"

// kubeletDataLink is the symlink through which the kubelet swaps the
// contents of a mounted ConfigMap at once: the files' own names don't change.
const kubeletDataLink = "..data"

// WatchDir loads dir into tracker, then keeps them equal until ctx ends,
// watching the directory with inotify (fsnotify; no polling). It returns
// once the first load is applied, with an error if the directory or any file
// in it cannot be read or decoded then: the daemon starts from a whole
// directory or not at all.
//
// After that every file stands on its own. A file that can't be read or
// decoded (or defines an object an earlier file already defines) keeps the
// objects it last yielded, is logged once with its name and the reason, and
// is counted with the invalid objects (KindManifestFile); the other files'
// changes apply as usual. A removed file removes its objects.
//
// When a changed file counts — so that half a file is never taken for the
// whole: a file renamed into the directory (or created) is read settle after
// that event, however many renames follow (each one replaces the file whole),
// so a file replaced continually is still read every settle; a file written
// in place is read once it has gone settle without a write, since until
// then the writer may be half-way; and a file that changes while it is read
// is read again settle later. Writers should write a temporary file and
// rename it, as editors and the kubelet (ConfigMap volumes) do. Each file
// has its own clock: other files changing never delay it. A read changes the
// tracker at once; the sync loop applies that within --min-sync-period.
func WatchDir(ctx context.Context, dir string, tracker *Tracker, log *zap.Logger, settle time.Duration) error {
	if log == nil {
		log = zap.NewNop()
	}
	if settle <= 0 {
		settle = DefaultSettle
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch manifest directory: %w", err)
	}
	// Watch before the first read, so nothing written in between is missed.
	if err := fsw.Add(dir); err != nil {
		_ = fsw.Close()
		return fmt.Errorf("watch manifest directory %s: %w", dir, err)
	}
	w := &dirWatcher{dir: dir, tracker: tracker, log: log.With(zap.String("dir", dir)), settle: settle,
		files: map[string]*fileState{}, logged: map[string]string{}, dups: map[string]bool{}}
	if err := w.loadAll(); err != nil {
		_ = fsw.Close()
		return err
	}
	go w.run(ctx, fsw)
	return nil
}

type dirWatcher struct {
	dir     string
	tracker *Tracker
	log     *zap.Logger
	settle  time.Duration

	files  map[string]*fileState
	due    map[string]time.Time // files to read, and when
	logged map[string]string    // file → the problem last logged for it
	dups   map[string]bool      // duplicate definitions logged
}

// fileState is what a file yielded when it last decoded, and what was last
// read from it, good or not.
type fileState struct {
	objs *manifests
	hash [32]byte
}

// loadAll is the first load: every file must read and decode. A file that
// changes while it is read is read again a little later.
func (w *dirWatcher) loadAll() error {
	names, err := scanDir(w.dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		var data []byte
		for try := 0; ; try++ {
			if data, err = readFile(w.dir, name); !errors.Is(err, errStillWriting) || try == 5 {
				break
			}
			time.Sleep(w.settle)
		}
		if err != nil {
			return err
		}
		m, err := decodeFile(name, data)
		if err != nil {
			return err
		}
		w.notes(m)
		w.files[name] = &fileState{objs: m, hash: sha256.Sum256(data)}
	}
	if dups := w.publish(); len(dups) > 0 {
		return dups[0]
	}
	return nil
}

func (w *dirWatcher) run(ctx context.Context, fsw *fsnotify.Watcher) {
	defer func() { _ = fsw.Close() }()
	w.due = map[string]time.Time{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case ev, ok := <-fsw.Events:
			if !ok {
				return
			}
			w.event(ev, time.Now())
		case err, ok := <-fsw.Errors:
			if !ok {
				return
			}
			// An overflowed queue lost events: look at every file again.
			w.log.Warn("Manifest directory watch error, rereading every file", zap.Error(err))
			w.all(time.Now())
		case <-timer.C:
			w.readDue(time.Now())
		}
		if next, ok := w.next(); ok {
			timer.Reset(time.Until(next))
		}
	}
}

// event schedules the read an inotify event calls for.
func (w *dirWatcher) event(ev fsnotify.Event, now time.Time) {
	name := filepath.Base(ev.Name)
	if name == kubeletDataLink {
		w.all(now)
		return
	}
	if !isManifest(name) {
		return
	}
	switch {
	case ev.Has(fsnotify.Write):
		// In place: wait until the writer has been quiet for settle.
		w.due[name] = now.Add(w.settle)
	case ev.Has(fsnotify.Create), ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		// Replaced or gone whole: a read due already stays due.
		if _, ok := w.due[name]; !ok {
			w.due[name] = now.Add(w.settle)
		}
	}
}

// all makes every file known or present due, as if each had been replaced.
func (w *dirWatcher) all(now time.Time) {
	names, _ := scanDir(w.dir)
	for name := range w.files {
		names = append(names, name)
	}
	for _, name := range names {
		if _, ok := w.due[name]; !ok {
			w.due[name] = now.Add(w.settle)
		}
	}
}

func (w *dirWatcher) next() (time.Time, bool) {
	var next time.Time
	for _, t := range w.due {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next, !next.IsZero()
}

// readDue reads the files whose time has come and publishes what changed.
func (w *dirWatcher) readDue(now time.Time) {
	changed := false
	var names []string
	for name, t := range w.due {
		if !t.After(now) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		delete(w.due, name)
		if w.read(name, now) {
			changed = true
		}
	}
	if changed {
		w.publish()
	}
}

// read reads one file and tells whether what it yields changed.
func (w *dirWatcher) read(name string, now time.Time) bool {
	data, err := readFile(w.dir, name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		delete(w.logged, name)
		if _, ok := w.files[name]; !ok {
			return false
		}
		delete(w.files, name)
		w.log.Info("Manifest file removed", zap.String("file", name))
		return true
	case errors.Is(err, errStillWriting):
		w.due[name] = now.Add(w.settle)
		return false
	case err != nil:
		w.problem(name, err)
		return false
	}
	st := w.files[name]
	if st == nil {
		st = &fileState{}
		w.files[name] = st
	}
	sum := sha256.Sum256(data)
	if sum == st.hash && (st.objs != nil || w.logged[name] != "") {
		return false // read before, and nothing changed
	}
	st.hash = sum
	m, err := decodeFile(name, data)
	if err != nil {
		w.problem(name, err)
		return false
	}
	if w.logged[name] != "" {
		w.log.Info("Manifest file loads again", zap.String("file", name))
		delete(w.logged, name)
	}
	w.notes(m)
	st.objs = m
	return true
}

// problem logs a file that can't be read or decoded, once per reason, and
// counts it; the file keeps the objects it last yielded.
func (w *dirWatcher) problem(name string, err error) {
	if w.logged[name] == err.Error() {
		return
	}
	w.logged[name] = err.Error()
	w.log.Error("Cannot load manifest file, keeping its last good objects", zap.String("file", name), zap.Error(err))
	w.tracker.countInvalid(KindManifestFile, "", name, err)
}

// publish hands the objects of every file to the tracker as the whole state,
// and returns the definitions left out as duplicates (logged once each).
func (w *dirWatcher) publish() []error {
	names := make([]string, 0, len(w.files))
	for name := range w.files {
		names = append(names, name)
	}
	slices.Sort(names)
	files := make(map[string]*manifests, len(w.files))
	for name, st := range w.files {
		files[name] = st.objs
	}
	m, dups := merge(names, files)
	for _, err := range dups {
		var me *ManifestError
		if errors.As(err, &me) && !w.dups[me.Error()] {
			w.dups[me.Error()] = true
			w.log.Error("Leaving out an object defined twice", zap.String("file", me.File), zap.Error(err))
			w.tracker.countInvalid(KindManifestFile, "", me.File, err)
		}
	}
	node := pickNode(m.nodes, w.tracker.NodeName())
	if node == nil && len(m.nodes) > 0 {
		w.log.Debug("No Node manifest for this node", zap.String("node", w.tracker.NodeName()))
	}
	w.tracker.ReplaceAll(m.services, m.slices, node)
	w.log.Debug("Loaded manifests", zap.Int("files", len(names)), zap.Int("services", len(m.services)),
		zap.Int("endpointSlices", len(m.slices)), zap.Bool("node", node != nil))
	return dups
}

// notes logs what a file's decoding noticed without failing it.
func (w *dirWatcher) notes(m *manifests) {
	for _, ig := range m.ignored {
		w.log.Debug("Ignoring manifest of an unused kind", zap.String("object", ig))
	}
	for _, warn := range m.warnings {
		w.log.Warn("Manifest has unknown or duplicate fields", zap.Error(warn))
	}
}
