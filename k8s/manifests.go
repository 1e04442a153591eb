package k8s

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// ManifestError names the file, and the document in it, that could not be
// read or decoded.
type ManifestError struct {
	File string
	Doc  int // 1-based; 0 when the whole file is concerned
	Err  error
}

func (e *ManifestError) Error() string {
	if e.Doc == 0 {
		return e.File + ": " + e.Err.Error()
	}
	return fmt.Sprintf("%s: document %d: %v", e.File, e.Doc, e.Err)
}

func (e *ManifestError) Unwrap() error { return e.Err }

// manifests is what a directory holds. Notes are things worth a log line
// that don't stop the load: ignored kinds, unknown fields.
type manifests struct {
	services []*v1.Service
	slices   []*discoveryv1.EndpointSlice
	nodes    []*v1.Node
	ignored  []string
	warnings []error
}

// LoadDir reads every *.yaml, *.yml and *.json file of dir (not hidden ones,
// not subdirectories), each holding one or more documents separated by
// "---": v1 Services, discovery.k8s.io/v1 EndpointSlices, v1 Nodes, and v1
// Lists of those. Other kinds are ignored. Objects without a namespace are in
// "default", as kubectl would put them. Any file that cannot be read or
// decoded, or an object defined twice, fails the whole load with a
// *ManifestError: never half a directory.
func LoadDir(dir string) ([]*v1.Service, []*discoveryv1.EndpointSlice, []*v1.Node, error) {
	files, err := scanDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	contents, err := readFiles(dir, files)
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := decodeFiles(contents)
	if err != nil {
		return nil, nil, nil, err
	}
	return m.services, m.slices, m.nodes, nil
}

// fileStat is what a poll compares to notice a changed file.
type fileStat struct {
	name  string
	size  int64
	mtime int64 // nanoseconds since the epoch
	ino   uint64
}

func isManifest(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// scanDir lists the manifest files of dir, sorted by name, following
// symlinks (a mounted ConfigMap is a directory of symlinks).
func scanDir(dir string) ([]fileStat, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read manifest directory: %w", err)
	}
	var out []fileStat
	for _, e := range entries {
		if !isManifest(e.Name()) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, &ManifestError{File: e.Name(), Err: fmt.Errorf("stat file: %w", err)}
		}
		if fi.IsDir() {
			continue
		}
		out = append(out, statOf(e.Name(), fi))
	}
	return out, nil
}

func statOf(name string, fi os.FileInfo) fileStat {
	s := fileStat{name: name, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = st.Ino
	}
	return s
}

type fileContent struct {
	name string
	data []byte
}

// readFiles reads the files; errStillWriting when one changed while it was
// read, so a half-written file is never taken for the whole one.
func readFiles(dir string, files []fileStat) ([]fileContent, error) {
	out := make([]fileContent, 0, len(files))
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, &ManifestError{File: f.name, Err: fmt.Errorf("read file: %w", err)}
		}
		fi, err := os.Stat(path)
		if err != nil {
			return nil, &ManifestError{File: f.name, Err: fmt.Errorf("stat file: %w", err)}
		}
		if statOf(f.name, fi) != f || int64(len(data)) != f.size {
			return nil, &ManifestError{File: f.name, Err: errStillWriting}
		}
		out = append(out, fileContent{name: f.name, data: data})
	}
	return out, nil
}

var errStillWriting = errors.New("file changed while being read")

// strictDecoder decodes the kinds client-go knows and reports unknown or
// duplicate fields, which are usually typos, as strict-decoding errors
// alongside the decoded object.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

func decodeFiles(files []fileContent) (*manifests, error) {
	m := &manifests{}
	seen := map[string]string{} // kind/namespace/name → file
	for _, f := range files {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(f.data)))
		for doc := 1; ; doc++ {
			raw, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, &ManifestError{File: f.name, Doc: doc, Err: fmt.Errorf("split documents: %w", err)}
			}
			if err := m.decodeDoc(raw, f.name, seen); err != nil {
				return nil, &ManifestError{File: f.name, Doc: doc, Err: err}
			}
		}
	}
	return m, nil
}

func (m *manifests) decodeDoc(raw []byte, file string, seen map[string]string) error {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("parse YAML: %w", err)
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		return nil // only comments or blank
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return fmt.Errorf("parse object: %w", err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return errors.New("parse object: apiVersion and kind are required")
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Service", "discovery.k8s.io/v1 EndpointSlice", "v1 Node":
	case "v1 List":
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(js, &list); err != nil {
			return fmt.Errorf("parse List: %w", err)
		}
		for i, item := range list.Items {
			if err := m.decodeDoc(item, file, seen); err != nil {
				return fmt.Errorf("items[%d]: %w", i, err)
			}
		}
		return nil
	default:
		m.ignored = append(m.ignored, fmt.Sprintf("%s: %s %s", file, tm.APIVersion, tm.Kind))
		return nil
	}
	obj, _, err := strictDecoder.Decode(js, nil, nil)
	if err != nil && !runtime.IsStrictDecodingError(err) {
		return fmt.Errorf("decode %s: %w", tm.Kind, err)
	}
	if err != nil {
		m.warnings = append(m.warnings, &ManifestError{File: file, Err: err})
	}
	var key string
	switch o := obj.(type) {
	case *v1.Service:
		if o.Namespace == "" {
			o.Namespace = metav1.NamespaceDefault
		}
		key = KindService + " " + o.Namespace + "/" + o.Name
		m.services = append(m.services, o)
	case *discoveryv1.EndpointSlice:
		if o.Namespace == "" {
			o.Namespace = metav1.NamespaceDefault
		}
		key = KindEndpointSlice + " " + o.Namespace + "/" + o.Name
		m.slices = append(m.slices, o)
	case *v1.Node:
		key = KindNode + " " + o.Name
		m.nodes = append(m.nodes, o)
	default:
		return fmt.Errorf("decode %s: got %T", tm.Kind, obj)
	}
	if prev, ok := seen[key]; ok {
		return fmt.Errorf("%s defined twice: %w (first in %s)", key, ErrDuplicate, prev)
	}
	seen[key] = file
	return nil
}

// pickNode returns the Node named name; without a name, the only Node.
func pickNode(nodes []*v1.Node, name string) *v1.Node {
	if name == "" && len(nodes) == 1 {
		return nodes[0]
	}
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// settle is how old a changed file must be before it is read: a writer that
// truncates then writes would otherwise be caught in between.
const settle = 200 * time.Millisecond

// DefaultPollInterval is how often WatchDir looks at the directory when
// given no interval.
const DefaultPollInterval = 300 * time.Millisecond

// WatchDir loads dir into tracker, then keeps them equal: it polls the
// directory every interval (DefaultPollInterval when 0) until ctx ends,
// applying each change with ReplaceAll. It returns once the first load is
// applied, with an error if the directory cannot be read or decoded then.
// Later, a directory that fails to load is logged, naming the file and the
// reason, and the last good state stays until the directory loads again.
func WatchDir(ctx context.Context, dir string, tracker *Tracker, log *zap.Logger, interval time.Duration) error {
	if log == nil {
		log = zap.NewNop()
	}
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	w := &dirWatcher{dir: dir, tracker: tracker, log: log.With(zap.String("dir", dir))}
	var files []fileStat
	var contents []fileContent
	var err error
	for try := 0; try < 5; try++ {
		if files, err = scanDir(dir); err != nil {
			return err
		}
		if contents, err = readFiles(dir, files); !errors.Is(err, errStillWriting) {
			break
		}
		time.Sleep(settle)
	}
	if err != nil {
		return err
	}
	if err := w.apply(contents); err != nil {
		return err
	}
	w.last = files
	go w.run(ctx, interval)
	return nil
}

type dirWatcher struct {
	dir     string
	tracker *Tracker
	log     *zap.Logger

	last    []fileStat // at the previous poll
	pending bool       // a change seen but not loaded yet
	hash    [32]byte   // of the contents last loaded or refused
	lastErr string     // to log a failing directory once, not every poll
}

func (w *dirWatcher) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			w.poll()
		}
	}
}

func (w *dirWatcher) poll() {
	files, err := scanDir(w.dir)
	if err != nil {
		w.failed(err)
		return
	}
	changed := !slices.Equal(files, w.last)
	if !changed && !w.pending {
		return
	}
	now := time.Now()
	unsettled := false
	for _, f := range files {
		i := slices.IndexFunc(w.last, func(o fileStat) bool { return o.name == f.name })
		if age := now.Sub(time.Unix(0, f.mtime)); age < settle && (i < 0 || w.last[i] != f) {
			unsettled = true
		}
	}
	w.last = files
	w.pending = true
	if unsettled {
		return
	}
	contents, err := readFiles(w.dir, files)
	if errors.Is(err, errStillWriting) {
		w.last = nil // look again next time
		return
	}
	w.pending = false
	if err != nil {
		w.failed(err)
		return
	}
	if sum := hashContents(contents); sum != w.hash {
		if err := w.apply(contents); err != nil {
			w.failed(err)
		}
	}
}

// apply decodes the contents and hands them to the tracker.
func (w *dirWatcher) apply(contents []fileContent) error {
	w.hash = hashContents(contents)
	m, err := decodeFiles(contents)
	if err != nil {
		return err
	}
	for _, ig := range m.ignored {
		w.log.Debug("Ignoring manifest of an unused kind", zap.String("object", ig))
	}
	for _, warn := range m.warnings {
		w.log.Warn("Manifest has unknown or duplicate fields", zap.Error(warn))
	}
	node := pickNode(m.nodes, w.tracker.NodeName())
	if node == nil && len(m.nodes) > 0 {
		w.log.Debug("No Node manifest for this node", zap.String("node", w.tracker.NodeName()))
	}
	w.tracker.ReplaceAll(m.services, m.slices, node)
	w.lastErr = ""
	w.log.Info("Loaded manifests", zap.Int("services", len(m.services)),
		zap.Int("endpointSlices", len(m.slices)), zap.Bool("node", node != nil))
	return nil
}

func (w *dirWatcher) failed(err error) {
	if err.Error() == w.lastErr {
		return
	}
	w.lastErr = err.Error()
	fields := []zap.Field{zap.Error(err)}
	var me *ManifestError
	if errors.As(err, &me) {
		fields = append(fields, zap.String("file", me.File))
	}
	w.log.Error("Cannot load manifests, keeping the last good state", fields...)
}

func hashContents(files []fileContent) [32]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00%d\x00", f.name, len(f.data))
		h.Write(f.data)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
