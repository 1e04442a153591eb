package k8s

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

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

// manifests is what a file (or a directory) holds. Notes are things worth a
// log line that don't stop the load: ignored kinds, unknown fields.
type manifests struct {
	services []*v1.Service
	slices   []*discoveryv1.EndpointSlice
	nodes    []*v1.Node
	keys     []string // kind namespace/name of each object, in file order
	ignored  []string
	warnings []error
	data     []byte // what the file held
	// each, when set, receives the Services and EndpointSlices instead of
	// the lists above, as they decode: the first load hands them over
	// without holding a whole file's objects.
	each func(obj any, key string)
}

// LoadDir reads every *.yaml, *.yml and *.json file of dir (not hidden ones,
// not subdirectories), each holding one or more documents separated by
// "---": v1 Services, discovery.k8s.io/v1 EndpointSlices, v1 Nodes, and v1
// Lists of those. Other kinds are ignored. Objects without a namespace are in
// "default", as kubectl would put them. Any file that cannot be read or
// decoded, or an object defined twice, fails the whole load with a
// *ManifestError: never half a directory.
func LoadDir(dir string) ([]*v1.Service, []*discoveryv1.EndpointSlice, []*v1.Node, error) {
	names, err := scanDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	files := map[string]*manifests{}
	for _, name := range names {
		data, _, err := readFile(dir, name)
		if err != nil {
			return nil, nil, nil, err
		}
		if files[name], err = decodeFile(name, data); err != nil {
			return nil, nil, nil, err
		}
	}
	m, dups := merge(names, files)
	if len(dups) > 0 {
		return nil, nil, nil, dups[0]
	}
	return m.services, m.slices, m.nodes, nil
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
func scanDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read manifest directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !isManifest(e.Name()) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, &ManifestError{File: e.Name(), Err: fmt.Errorf("stat file: %w", err)}
		}
		if !fi.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// readFile reads one file whole, with the hash of its content;
// errStillWriting when it changed while it was read (size, modification
// time or inode), so that content is not taken for the whole file.
func readFile(dir, name string) ([]byte, [32]byte, error) {
	var buf bytes.Buffer
	sum, err := streamFile(dir, name, func(r io.Reader) error {
		if _, err := buf.ReadFrom(r); err != nil {
			return &ManifestError{File: name, Err: fmt.Errorf("read file: %w", err)}
		}
		return nil
	})
	if err != nil {
		return nil, sum, err
	}
	return buf.Bytes(), sum, nil
}

// streamFile reads one file through decode, as it reads, and returns the
// hash of what it read: a file's bytes are never held whole (at 100k
// services the file is 77 MB). errStillWriting when the file changed while
// it was read (size, modification time or inode), which a decode error of a
// torn file is too.
func streamFile(dir, name string, decode func(io.Reader) error) ([32]byte, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		return [32]byte{}, &ManifestError{File: name, Err: fmt.Errorf("read file: %w", err)}
	}
	defer func() { _ = f.Close() }()
	before, err := f.Stat()
	if err != nil {
		return [32]byte{}, &ManifestError{File: name, Err: fmt.Errorf("stat file: %w", err)}
	}
	if before.IsDir() {
		return [32]byte{}, &ManifestError{File: name, Err: fmt.Errorf("read file: %w", os.ErrNotExist)}
	}
	h := sha256.New()
	r := &countingReader{r: io.TeeReader(f, h)}
	decodeErr := decode(r)
	if decodeErr == nil {
		// Read to the end, for the hash and the size: the decoder may
		// stop before trailing blank lines.
		if _, err := io.Copy(io.Discard, r); err != nil {
			return [32]byte{}, &ManifestError{File: name, Err: fmt.Errorf("read file: %w", err)}
		}
	}
	after, err := os.Stat(path)
	if err != nil {
		return [32]byte{}, &ManifestError{File: name, Err: fmt.Errorf("stat file: %w", err)}
	}
	if !sameFile(before, after) || (decodeErr == nil && r.n != after.Size()) {
		return [32]byte{}, &ManifestError{File: name, Err: errStillWriting}
	}
	if decodeErr != nil {
		return [32]byte{}, decodeErr
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func sameFile(a, b os.FileInfo) bool {
	if a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
		return false
	}
	sa, oka := a.Sys().(*syscall.Stat_t)
	sb, okb := b.Sys().(*syscall.Stat_t)
	return !oka || !okb || sa.Ino == sb.Ino
}

var errStillWriting = errors.New("file changed while being read")

// strictDecoder decodes the kinds client-go knows and reports unknown or
// duplicate fields, which are usually typos, as strict-decoding errors
// alongside the decoded object.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// decodeFile decodes the documents of one file; an object defined twice in
// it fails the file.
func decodeFile(name string, data []byte) (*manifests, error) {
	return decodeInto(&manifests{data: data}, name, bytes.NewReader(data))
}

// decodeInto is decodeFile into m, whose each (when set) takes the
// Services and EndpointSlices as they decode.
func decodeInto(m *manifests, name string, data io.Reader) (*manifests, error) {
	seen := map[string]bool{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(data))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, &ManifestError{File: name, Doc: doc, Err: fmt.Errorf("split documents: %w", err)}
		}
		if err := m.decodeDoc(raw, name, seen); err != nil {
			return nil, &ManifestError{File: name, Doc: doc, Err: err}
		}
	}
	return m, nil
}

// merge joins the files' objects, files in the order of names. An object
// defined in an earlier file wins; the later definition is left out and
// returned as an error naming its file.
func merge(names []string, files map[string]*manifests) (*manifests, []error) {
	out := &manifests{}
	first := map[string]string{} // key → file
	var dups []error
	for _, name := range names {
		m := files[name]
		if m == nil {
			continue
		}
		skip := map[string]bool{}
		for _, key := range m.keys {
			if prev, ok := first[key]; ok {
				skip[key] = true
				dups = append(dups, duplicate(name, key, prev))
				continue
			}
			first[key] = name
		}
		for _, o := range m.services {
			if !skip[objectKey(o)] {
				out.services = append(out.services, o)
			}
		}
		for _, o := range m.slices {
			if !skip[objectKey(o)] {
				out.slices = append(out.slices, o)
			}
		}
		for _, o := range m.nodes {
			if !skip[objectKey(o)] {
				out.nodes = append(out.nodes, o)
			}
		}
	}
	return out, dups
}

// objectKey is how merge and decodeDoc name an object.
func objectKey(obj any) string {
	switch o := obj.(type) {
	case *v1.Service:
		return KindService + " " + o.Namespace + "/" + o.Name
	case *discoveryv1.EndpointSlice:
		return KindEndpointSlice + " " + o.Namespace + "/" + o.Name
	case *v1.Node:
		return KindNode + " " + o.Name
	}
	return ""
}

func (m *manifests) decodeDoc(raw []byte, file string, seen map[string]bool) error {
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
	switch o := obj.(type) {
	case *v1.Service:
		if o.Namespace == "" {
			o.Namespace = metav1.NamespaceDefault
		}
	case *discoveryv1.EndpointSlice:
		if o.Namespace == "" {
			o.Namespace = metav1.NamespaceDefault
		}
	case *v1.Node:
	default:
		return fmt.Errorf("decode %s: got %T", tm.Kind, obj)
	}
	key := objectKey(obj)
	if seen[key] {
		return fmt.Errorf("%s defined twice: %w", key, ErrDuplicate)
	}
	seen[key] = true
	m.keys = append(m.keys, key)
	switch o := obj.(type) {
	case *v1.Node:
		m.nodes = append(m.nodes, o)
	case *v1.Service:
		if m.each != nil {
			m.each(o, key)
		} else {
			m.services = append(m.services, o)
		}
	case *discoveryv1.EndpointSlice:
		if m.each != nil {
			m.each(o, key)
		} else {
			m.slices = append(m.slices, o)
		}
	}
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
