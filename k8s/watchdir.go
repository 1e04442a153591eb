package k8s

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
// decoded keeps the objects it last yielded, is logged once with its name
// and the reason, and is counted with the invalid objects
// (KindManifestFile); the other files' changes apply as usual. A removed
// file removes its objects. An object defined in several files is the first
// file's by name; the others' definitions are left out, logged and counted
// the same way, and one of them counts when the first goes (the file's last
// good one, unless the file was broken already when an earlier file came to
// define the object too: then its definition is out until the file loads
// again). Only the keys of the objects are kept once they are handed over.
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
	w := newDirWatcher(dir, tracker, log.With(zap.String("dir", dir)), settle)
	if err := w.loadAll(); err != nil {
		_ = fsw.Close()
		return err
	}
	go w.run(ctx, fsw)
	return nil
}

func newDirWatcher(dir string, tracker *Tracker, log *zap.Logger, settle time.Duration) *dirWatcher {
	return &dirWatcher{dir: dir, tracker: tracker, log: log, settle: settle,
		files: map[string]*fileState{}, owner: map[string]string{}, also: map[string][]string{},
		logged: map[string]string{}, dups: map[string]bool{}, stream: streamFile}
}

type dirWatcher struct {
	dir     string
	tracker *Tracker
	log     *zap.Logger
	settle  time.Duration

	files map[string]*fileState
	// owner names, for each object key, the file whose definition counts:
	// the first by name of those defining it. also holds the later ones, in
	// name order: their definitions are left out as duplicates. Only the
	// keys are kept, not the objects: the tracker keeps what it derived, and
	// at 100k services the decoded objects were half the daemon's heap.
	owner  map[string]string
	also   map[string][]string
	due    map[string]time.Time // files to read, and when
	logged map[string]string    // file → the problem last logged for it
	dups   map[string]bool      // duplicate definitions logged
	// stream reads a file through a decoder (streamFile; tests stand in
	// for it).
	stream func(dir, name string, decode func(io.Reader) error) ([32]byte, error)
}

// fileState is what a file yielded when it last decoded (the keys of its
// objects, and its Nodes, among which the node's own is picked), and the
// hash of what was last read from it, good or not.
type fileState struct {
	decoded bool
	keys    []string
	nodes   []*v1.Node
	hash    [32]byte
	// good is what the file held when it last decoded, kept while an
	// earlier file defines one of its objects too: should that definition
	// go, this file's last good one counts, even if the file is broken now.
	good []byte
}

// loadAll is the first load: every file must read and decode, and no
// object may be defined twice. A file that changes while it is read is read
// again a little later. The objects go to the tracker as they decode, a few
// hundred at a time, so that a whole file's are never held at once (at 100k
// services they were most of the start-up's peak); on an error the caller
// gives up on the tracker, never syncing it.
func (w *dirWatcher) loadAll() error {
	names, err := scanDir(w.dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		var st *fileState
		for try := 0; ; try++ {
			if st, err = w.loadFile(name); !errors.Is(err, errStillWriting) || try == 5 {
				break
			}
			time.Sleep(w.settle)
		}
		if err != nil {
			return err
		}
		w.files[name] = st
	}
	w.tracker.Edit(w.setNode)
	return nil
}

// duplicate is the error of file defining the object key again.
func duplicate(file, key, first string) error {
	return &ManifestError{File: file, Err: fmt.Errorf("%s defined twice: %w (first in %s)", key, ErrDuplicate, first)}
}

// loadFile hands a file's objects over as they decode, in the first load,
// the file read as it decodes (w.stream). A file that changed while it was
// read takes back what it handed over: it is read again whole.
func (w *dirWatcher) loadFile(name string) (*fileState, error) {
	var dup error
	var batch []any
	var handed []string
	flush := func() {
		w.tracker.Edit(func(e *Editor) {
			for _, o := range batch {
				switch o := o.(type) {
				case *v1.Service:
					e.SetService(o)
				case *discoveryv1.EndpointSlice:
					e.SetSlice(o)
				}
			}
		})
		batch = batch[:0]
	}
	m := &manifests{each: func(o any, key string) {
		if first, ok := w.owner[key]; ok {
			dup = cmp.Or(dup, duplicate(name, key, first))
			return
		}
		w.owner[key] = name
		handed = append(handed, key)
		if batch = append(batch, o); len(batch) == 512 {
			flush()
		}
	}}
	sum, err := w.stream(w.dir, name, func(r io.Reader) error {
		_, err := decodeInto(m, name, r)
		return err
	})
	if errors.Is(err, errStillWriting) {
		batch = batch[:0]
		w.tracker.Edit(func(e *Editor) {
			for _, key := range handed {
				deleteObject(e, key)
				delete(w.owner, key)
			}
		})
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	flush()
	if dup != nil {
		return nil, dup
	}
	for _, n := range m.nodes {
		key := objectKey(n)
		if first, ok := w.owner[key]; ok {
			return nil, duplicate(name, key, first)
		}
		w.owner[key] = name
	}
	w.notes(m)
	return &fileState{hash: sum, decoded: true, keys: m.keys, nodes: m.nodes}, nil
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
	var names []string
	for name, t := range w.due {
		if !t.After(now) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	changed := map[string]*manifests{}
	for _, name := range names {
		delete(w.due, name)
		if m, ok := w.read(name, now); ok {
			changed[name] = m
		}
	}
	if len(changed) > 0 {
		w.publish(changed)
	}
}

// read reads one file and tells whether what it yields changed, and to
// what: nil when the file is gone.
func (w *dirWatcher) read(name string, now time.Time) (*manifests, bool) {
	data, sum, err := readFile(w.dir, name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		delete(w.logged, name)
		if _, ok := w.files[name]; !ok {
			return nil, false
		}
		w.log.Info("Manifest file removed", zap.String("file", name))
		return nil, true
	case errors.Is(err, errStillWriting):
		w.due[name] = now.Add(w.settle)
		return nil, false
	case err != nil:
		w.problem(name, err)
		return nil, false
	}
	st := w.files[name]
	if st == nil {
		st = &fileState{}
		w.files[name] = st
	}
	if sum == st.hash && (st.decoded || w.logged[name] != "") {
		return nil, false // read before, and nothing changed
	}
	st.hash = sum
	m, err := decodeFile(name, data)
	if err != nil {
		w.problem(name, err)
		return nil, false
	}
	if w.logged[name] != "" {
		w.log.Info("Manifest file loads again", zap.String("file", name))
		delete(w.logged, name)
	}
	w.notes(m)
	return m, true
}

// problem logs a file that can't be read or decoded, once per reason, and
// counts it; the file keeps the objects it last yielded.
func (w *dirWatcher) problem(name string, err error) {
	if w.logProblem(name, err, "Cannot load manifest file, keeping its last good objects") {
		w.tracker.Edit(func(e *Editor) { e.CountInvalid(KindManifestFile, "", name, err) })
	}
}

// logProblem logs a file's problem unless it was the last one logged for
// the file, and tells whether it did.
func (w *dirWatcher) logProblem(name string, err error, msg string) bool {
	if w.logged[name] == err.Error() {
		return false
	}
	w.logged[name] = err.Error()
	w.log.Error(msg, zap.String("file", name), zap.Error(err))
	return true
}

// publish hands the tracker, as one change, what the changed files yield
// now against what they yielded before (nil: the file is gone); the
// definitions left out as duplicates are logged and counted once each.
//
// Objects that leave a file leave its definitions first, and then the new
// definitions come, so that an object moving between two files read
// together is never taken for a duplicate. An object whose owner changes to
// a file not read now (the first definition went away) is set from that
// file, read again for it.
func (w *dirWatcher) publish(changed map[string]*manifests) {
	w.tracker.Edit(func(e *Editor) {
		for len(changed) > 0 {
			changed = w.apply(e, changed)
		}
		w.setNode(e)
	})
	w.log.Debug("Loaded manifests", zap.Int("files", len(w.files)), zap.Int("objects", len(w.owner)))
}

// apply is one round of publish; it returns the files to read for the
// objects they now own.
func (w *dirWatcher) apply(e *Editor, changed map[string]*manifests) map[string]*manifests {
	before := ownersBefore{}
	w.leave(changed, before)
	w.arrive(e, changed, before)
	w.keepGood(changed)
	return w.resolve(e, changed, before)
}

// ownersBefore holds, for each key a round of apply touches, its owner
// before the round ("" for none).
type ownersBefore map[string]string

// touch records owner as key's owner before, unless key was touched already.
func (b ownersBefore) touch(key, owner string) {
	if _, ok := b[key]; !ok {
		b[key] = owner
	}
}

// leave takes each changed file off the definers of the keys it no longer
// yields.
func (w *dirWatcher) leave(changed map[string]*manifests, before ownersBefore) {
	for name, m := range changed {
		st := w.files[name]
		if st == nil {
			continue
		}
		var now map[string]bool
		if m != nil {
			now = keySet(m.keys)
		}
		for _, key := range st.keys {
			if !now[key] {
				before.touch(key, w.owner[key])
				w.setDefiners(key, slices.DeleteFunc(w.definers(key), func(f string) bool { return f == name }))
			}
		}
	}
}

// arrive adds each changed file still there to the definers of the keys it
// yields, keeps what it yields and sets the objects it owns; a file gone is
// forgotten.
func (w *dirWatcher) arrive(e *Editor, changed map[string]*manifests, before ownersBefore) {
	for name, m := range changed {
		if m == nil {
			delete(w.files, name)
			continue
		}
		st := w.files[name]
		for _, key := range m.keys {
			before.touch(key, w.owner[key])
			d := w.definers(key)
			if i, found := slices.BinarySearch(d, name); !found {
				w.setDefiners(key, slices.Insert(d, i, name))
			}
		}
		st.decoded, st.keys, st.nodes = true, m.keys, m.nodes
		w.setOwned(e, name, m)
	}
}

// setOwned sets every object of m that the file name owns. All of them,
// changed or not: the tracker compares what it derives with what it holds.
func (w *dirWatcher) setOwned(e *Editor, name string, m *manifests) {
	for _, o := range m.services {
		if w.owner[objectKey(o)] == name {
			e.SetService(o)
		}
	}
	for _, o := range m.slices {
		if w.owner[objectKey(o)] == name {
			e.SetSlice(o)
		}
	}
}

// resolve settles the keys a round touched: an object no file defines any
// more leaves the tracker, one taken over by a file not read this round has
// that file read again (returned, for the next round), and the definitions
// left out as duplicates are logged and counted.
func (w *dirWatcher) resolve(e *Editor, changed map[string]*manifests, before ownersBefore) map[string]*manifests {
	var again map[string]*manifests
	for key, was := range before {
		owner, ok := w.owner[key]
		switch {
		case !ok:
			if was != "" {
				deleteObject(e, key)
			}
		case owner != was && !strings.HasPrefix(key, KindNode+" "):
			if _, read := changed[owner]; read {
				break
			}
			// Taken over by a file not read now: read it again. (A file
			// keeps its Nodes: setNode needs no read.)
			if again == nil {
				again = map[string]*manifests{}
			}
			if _, ok := again[owner]; !ok {
				again[owner] = w.reread(e, owner)
			}
		}
		w.countDuplicates(e, key, owner)
	}
	return again
}

// countDuplicates logs and counts, once each, the definitions of key left
// out because owner's counts.
func (w *dirWatcher) countDuplicates(e *Editor, key, owner string) {
	for _, f := range w.also[key] {
		if err := duplicate(f, key, owner); !w.dups[err.Error()] {
			w.dups[err.Error()] = true
			w.log.Error("Leaving out an object defined twice", zap.String("file", f), zap.Error(err))
			e.CountInvalid(KindManifestFile, "", f, err)
		}
	}
}

// keySet is the set of keys.
func keySet(keys []string) map[string]bool {
	set := make(map[string]bool, len(keys))
	for _, k := range keys {
		set[k] = true
	}
	return set
}

// keepGood keeps the last good content of the files that define an object
// an earlier file defines too (few: it is an error), and of no other.
func (w *dirWatcher) keepGood(changed map[string]*manifests) {
	later := map[string]bool{}
	for _, files := range w.also {
		for _, f := range files {
			later[f] = true
		}
	}
	for name, st := range w.files {
		switch {
		case !later[name]:
			st.good = nil
		case changed[name] != nil:
			st.good = changed[name].data
		case st.good == nil:
			// An earlier file defines one of its objects now: its content
			// is its last good one unless it changed since.
			// (Nothing logged for it: what was last read of it decoded.)
			if data, sum, err := readFile(w.dir, name); err == nil && w.logged[name] == "" && sum == st.hash {
				st.good = data
			}
		}
	}
}

// reread decodes a file again for the objects it now owns: its last good
// content when kept, else what it holds now. One that can't be read or
// decoded yields nothing, as if removed, until it does.
func (w *dirWatcher) reread(e *Editor, name string) *manifests {
	if good := w.files[name].good; good != nil {
		if m, err := decodeFile(name, good); err == nil {
			return m
		}
	}
	data, sum, err := readFile(w.dir, name)
	if err == nil {
		var m *manifests
		if m, err = decodeFile(name, data); err == nil {
			w.files[name].hash = sum
			return m
		}
	}
	// Read in full as soon as it can be: the objects it owns are out.
	w.files[name].hash = [32]byte{}
	if w.due != nil {
		w.due[name] = time.Now().Add(w.settle)
	}
	// Inside the tracker's Edit: counted through the editor.
	if !errors.Is(err, errStillWriting) && w.logProblem(name, err, "Cannot load manifest file, leaving out the objects it takes over") {
		e.CountInvalid(KindManifestFile, "", name, err)
	}
	return &manifests{}
}

// definers returns the files that define key, in name order.
func (w *dirWatcher) definers(key string) []string {
	o, ok := w.owner[key]
	if !ok {
		return nil
	}
	return append([]string{o}, w.also[key]...)
}

func (w *dirWatcher) setDefiners(key string, files []string) {
	if len(files) == 0 {
		delete(w.owner, key)
		delete(w.also, key)
		return
	}
	w.owner[key] = files[0]
	if len(files) > 1 {
		w.also[key] = slices.Clone(files[1:])
	} else {
		delete(w.also, key)
	}
}

// setNode gives the tracker this node's Node among those the files own.
func (w *dirWatcher) setNode(e *Editor) {
	names := make([]string, 0, len(w.files))
	for name, st := range w.files {
		if len(st.nodes) > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var nodes []*v1.Node
	for _, name := range names {
		for _, n := range w.files[name].nodes {
			if w.owner[objectKey(n)] == name {
				nodes = append(nodes, n)
			}
		}
	}
	node := pickNode(nodes, w.tracker.NodeName())
	if node == nil && len(nodes) > 0 {
		w.log.Debug("No Node manifest for this node", zap.String("node", w.tracker.NodeName()))
	}
	e.SetNode(node)
}

// deleteObject removes the object an objectKey names from the tracker.
func deleteObject(e *Editor, key string) {
	kind, ref, _ := strings.Cut(key, " ")
	ns, name, _ := strings.Cut(ref, "/")
	switch kind {
	case KindService:
		e.DeleteService(ns, name)
	case KindEndpointSlice:
		e.DeleteSlice(ns, name)
	}
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
