package k8s

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// aliasBomb is YAML whose aliases expand to 9^9 strings: the decoder refuses
// it ("excessive aliasing") instead of expanding it.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		fmt.Fprintf(&b, "%s: &%s [%s]\n", n, n, strings.TrimSuffix(strings.Repeat("*"+prev+",", 9), ","))
		prev = n
	}
	return b.String()
}

// webSlice is sliceYAML with the given endpoint addresses.
func webSlice(addrs ...string) string {
	return strings.Replace(sliceYAML, `- addresses: ["10.244.0.1"]`, `- addresses: ["`+strings.Join(addrs, "\"]\n- addresses: [\"")+`"]`, 1)
}

// watch starts WatchDir on dir with a tracker counting invalid objects.
func watch(t *testing.T, dir string) (*Tracker, *atomic.Int64) {
	t.Helper()
	log, _ := observed()
	var invalid atomic.Int64
	tr := NewTracker(log, TrackerOptions{OnInvalid: func(kind, _, _ string, _ error) {
		if kind == KindManifestFile {
			invalid.Add(1)
		}
	}})
	if err := WatchDir(t.Context(), dir, tr, log, 0); err != nil {
		t.Fatal(err)
	}
	drain(tr)
	return tr, &invalid
}

// TestWatchDirIsolatesBrokenFile: a file that stops decoding keeps its last
// good objects, is logged once and counted once; the other files' changes
// apply as usual, and fixing it applies it again.
func TestWatchDirIsolatesBrokenFile(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"services.yaml": servicesYAML, "slice.yaml": sliceYAML,
		"dns.yaml": strings.Replace(listYAML, "10.244.0.53", "10.244.0.54", 1)})
	log, logs := observed()
	var invalid atomic.Int64
	tr := NewTracker(log, TrackerOptions{OnInvalid: func(kind, _, name string, _ error) {
		if kind == KindManifestFile && name == "dns.yaml" {
			invalid.Add(1)
		}
	}})
	if err := WatchDir(t.Context(), dir, tr, log, 0); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{aliasBomb(), "kind: [unclosed\n"} {
		writeFiles(t, dir, map[string]string{"dns.yaml": bad})
		writeFiles(t, dir, map[string]string{"slice.yaml": webSlice("10.244.0.1", "10.244.0.2")})
		eventually(t, func() string {
			if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1 10.244.0.2" {
				return "web endpoints " + got
			}
			return ""
		})
		writeFiles(t, dir, map[string]string{"slice.yaml": sliceYAML})
		eventually(t, func() string {
			if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1" {
				return "web endpoints " + got
			}
			return ""
		})
		if got := endpointAddrs(tr.Snapshot(), "dns"); got != "10.244.0.54" {
			t.Errorf("dns endpoints %q: the broken file lost its last good objects", got)
		}
	}
	problems := logs.FilterMessage("Cannot load manifest file, keeping its last good objects").All()
	if len(problems) != 2 || invalid.Load() != 2 {
		t.Fatalf("%d problems logged, %d counted; want 2 each (one per reason)", len(problems), invalid.Load())
	}
	if f := problems[0].ContextMap(); f["file"] != "dns.yaml" || !strings.Contains(fmt.Sprint(f["error"]), "excessive aliasing") {
		t.Errorf("first problem logged as %v, want dns.yaml and excessive aliasing", f)
	}

	// Fixed: applies; removed: its objects go.
	writeFiles(t, dir, map[string]string{"dns.yaml": listYAML})
	eventually(t, func() string {
		if got := endpointAddrs(tr.Snapshot(), "dns"); got != "10.244.0.53" {
			return "dns endpoints " + got
		}
		return ""
	})
	if err := os.Remove(filepath.Join(dir, "dns.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if got := endpointAddrs(tr.Snapshot(), "dns"); got != "" {
			return "dns endpoints after removal " + got
		}
		return ""
	})
}

// TestWatchDirDuplicateLeftOut: an object a later file defines again is left
// out, counted, and the rest of that file applies.
func TestWatchDirDuplicateLeftOut(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": sliceYAML, "services.yaml": servicesYAML})
	tr, invalid := watch(t, dir)
	writeFiles(t, dir, map[string]string{"b.yaml": webSlice("10.244.0.9") + "---\n" + listYAML})
	// The count may land just after the file's objects do.
	eventually(t, func() string {
		if got := endpointAddrs(tr.Snapshot(), "dns"); got != "10.244.0.53" || invalid.Load() == 0 {
			return fmt.Sprintf("dns endpoints %q, %d counted", got, invalid.Load())
		}
		return ""
	})
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1" || invalid.Load() != 1 {
		t.Errorf("web endpoints %q, %d counted; want a.yaml's and 1", got, invalid.Load())
	}
}

// TestWatchDirDuplicateTakesOver: the first file by name that defines an
// object wins, whichever file changes: an earlier file defining it takes
// it over, and when the winner drops it the next file's definition (read
// again for it) applies.
func TestWatchDirDuplicateTakesOver(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"m.yaml": webSlice("10.244.0.5"), "services.yaml": servicesYAML})
	tr, invalid := watch(t, dir)
	web := func(want string) {
		t.Helper()
		eventually(t, func() string {
			if got := endpointAddrs(tr.Snapshot(), "web"); got != want {
				return "web endpoints " + got + ", want " + want
			}
			return ""
		})
	}
	web("10.244.0.5")
	writeFiles(t, dir, map[string]string{"z.yaml": webSlice("10.244.0.9")})
	eventually(t, func() string {
		if invalid.Load() != 1 {
			return "z.yaml's duplicate not counted"
		}
		return ""
	})
	web("10.244.0.5")
	writeFiles(t, dir, map[string]string{"a.yaml": webSlice("10.244.0.1")})
	web("10.244.0.1")
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	web("10.244.0.5")
	writeFiles(t, dir, map[string]string{"m.yaml": listYAML})
	web("10.244.0.9")
	if got := endpointAddrs(tr.Snapshot(), "dns"); got != "10.244.0.53" {
		t.Errorf("dns endpoints %q", got)
	}
	if err := os.Remove(filepath.Join(dir, "z.yaml")); err != nil {
		t.Fatal(err)
	}
	web("")
}

// TestWatchDirChurnDoesNotStarve: while one file is replaced every 2 ms, it
// is still read every settle time, and a change to another file applies
// within a settle time or two.
func TestWatchDirChurnDoesNotStarve(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"services.yaml": servicesYAML, "slice.yaml": sliceYAML, "dns.yaml": listYAML})
	tr, _ := watch(t, dir)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			writeFiles(t, dir, map[string]string{"slice.yaml": webSlice("10.244.0.1", fmt.Sprintf("10.244.1.%d", i%200+1))})
			time.Sleep(2 * time.Millisecond)
		}
	}()
	changes := 0
	timeout := time.After(time.Second)
	start := time.Now()
loop:
	for {
		select {
		case <-tr.Changed():
			changes++
		case <-timeout:
			break loop
		}
	}
	writeFiles(t, dir, map[string]string{"dns.yaml": strings.Replace(listYAML, "10.244.0.53", "10.244.0.54", 1)})
	written := time.Now()
	eventually(t, func() string {
		if got := endpointAddrs(tr.Snapshot(), "dns"); got != "10.244.0.54" {
			return "dns endpoints " + got
		}
		return ""
	})
	took := time.Since(written)
	close(stop)
	<-done
	// Reads every settle time: ~20 in a second; allow a loaded machine half.
	if want := int(time.Since(start) / DefaultSettle / 2); changes < want/2 {
		t.Errorf("%d changes in a second of churn, want at least %d", changes, want/2)
	}
	if took > 10*DefaultSettle {
		t.Errorf("a change to another file took %v during the churn", took)
	}
	t.Logf("%d changes in 1s of churn; another file applied after %v", changes, took)
}

// TestWatchDirHalfWrittenFile: a file written in place in two parts, the
// first of which decodes on its own, is read only once whole.
func TestWatchDirHalfWrittenFile(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"services.yaml": servicesYAML, "slice.yaml": sliceYAML})
	tr, _ := watch(t, dir)
	whole := webSlice("10.244.0.1", "10.244.0.2", "10.244.0.3")
	half := whole[:strings.Index(whole, `- addresses: ["10.244.0.3"]`)] // decodes: two endpoints, no ports
	f, err := os.OpenFile(filepath.Join(dir, "slice.yaml"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(half); err != nil {
		t.Fatal(err)
	}
	time.Sleep(DefaultSettle / 3)
	if _, err := f.WriteAt([]byte(whole), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitChange(t, tr, "file written in place")
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1 10.244.0.2 10.244.0.3" {
		t.Errorf("endpoints %q, want the whole file's", got)
	}
	select {
	case <-tr.Changed():
		t.Error("a second change: the half-written file was applied first")
	case <-time.After(3 * DefaultSettle):
	}
}

// TestWatcherMatchesWholeDirectory: after any sequence of files written,
// broken and removed, what the watcher handed over file by file is what the
// whole directory's last good files give when merged at once (the first
// definition by file name wins). It is checked whenever no file is broken:
// an object a broken file defined after an earlier file defined it too can
// be out until the file loads again (WatchDir).
func TestWatcherMatchesWholeDirectory(t *testing.T) {
	service := func(name, ip string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s}\nspec:\n  clusterIP: %s\n  ports: [{name: http, port: 80}]\n", name, ip)
	}
	slice := func(name, svc, addr string) string {
		return fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s, labels: {kubernetes.io/service-name: %s}}\n"+
			"addressType: IPv4\nendpoints: [{addresses: [%q]}]\nports: [{name: http, port: 8080}]\n", name, svc, addr)
	}
	node := func(zone string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: %s}}\n", zone)
	}
	rnd := rand.New(rand.NewPCG(7, 11))
	objects := func() string {
		var docs []string
		for i, svc := range []string{"web", "api", "dns"} {
			if rnd.IntN(2) == 0 {
				docs = append(docs, service(svc, fmt.Sprintf("10.96.0.%d", 10+i+10*rnd.IntN(2))))
			}
			if rnd.IntN(2) == 0 {
				docs = append(docs, slice(svc+"-1", svc, fmt.Sprintf("10.244.%d.%d", i, 1+rnd.IntN(3))))
			}
		}
		if rnd.IntN(4) == 0 {
			docs = append(docs, node(fmt.Sprintf("z%d", rnd.IntN(2))))
		}
		return strings.Join(docs, "---\n")
	}
	dir := t.TempDir()
	names := []string{"a.yaml", "b.yaml", "c.yaml", "d.yaml"}
	good := map[string]string{}
	good["b.yaml"] = objects()
	writeFiles(t, dir, map[string]string{"b.yaml": good["b.yaml"]})
	log, _ := observed()
	tr := NewTracker(log, TrackerOptions{FallbackNode: Node{Name: "node-a"}})
	w := newDirWatcher(dir, tr, log, time.Millisecond)
	w.due = map[string]time.Time{}
	// Duplicates across files fail the first load: one file, then others.
	if err := w.loadAll(); err != nil {
		t.Fatal(err)
	}
	broken := map[string]bool{}
	for step := range 1000 {
		// Change one to three files at a time: read together, in one publish.
		for range 1 + rnd.IntN(3) {
			name := names[rnd.IntN(len(names))]
			switch rnd.IntN(8) {
			case 0:
				delete(good, name)
				delete(broken, name)
				_ = os.Remove(filepath.Join(dir, name))
			case 1:
				broken[name] = true
				writeFiles(t, dir, map[string]string{name: "kind: [unclosed\n"})
			default:
				delete(broken, name)
				good[name] = objects()
				writeFiles(t, dir, map[string]string{name: good[name]})
			}
			w.due[name] = time.Time{}
		}
		w.readDue(time.Now())
		if len(broken) > 0 {
			continue
		}
		// What the files that last decoded give, merged at once.
		files := map[string]*manifests{}
		var present []string
		for name, data := range good {
			m, err := decodeFile(name, []byte(data))
			if err != nil {
				t.Fatal(err)
			}
			files[name] = m
			present = append(present, name)
		}
		slices.Sort(present)
		m, _ := merge(present, files)
		ref := NewTracker(nil, TrackerOptions{FallbackNode: Node{Name: "node-a"}})
		ref.ReplaceAll(m.services, m.slices, pickNode(m.nodes, "node-a"))
		got, want := tr.Snapshot(), ref.Snapshot()
		if !reflect.DeepEqual(got.Services, want.Services) || !reflect.DeepEqual(got.Node, want.Node) {
			t.Fatalf("step %d: the watcher's state\n%+v\n%+v\nthe whole directory's\n%+v\n%+v", step, got.Services, got.Node, want.Services, want.Node)
		}
	}
}

// TestStreamFile: a file read through its decoder gives the hash of its
// content; one that changes while it is read is errStillWriting, and so is
// a decode error of a file that changed meanwhile.
func TestStreamFile(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"s.yaml": servicesYAML})
	path := filepath.Join(dir, "s.yaml")
	read := func(r io.Reader) error { _, err := decodeInto(&manifests{}, "s.yaml", r); return err }
	sum, err := streamFile(dir, "s.yaml", read)
	if err != nil || sum != sha256.Sum256([]byte(servicesYAML)) {
		t.Fatalf("unchanged file: hash %x, err %v; want the content's hash", sum, err)
	}
	// The file is appended to halfway through the read.
	appendHalfway := func(tail string) func(io.Reader) error {
		return func(r io.Reader) error {
			if _, err := r.Read(make([]byte, 16)); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteString(tail)
			// A later modification time, whatever the clock's grain.
			_ = os.Chtimes(path, time.Time{}, time.Now().Add(time.Hour))
			return errors.Join(err, f.Close(), read(r))
		}
	}
	if _, err := streamFile(dir, "s.yaml", appendHalfway("\n---\n"+sliceYAML)); !errors.Is(err, errStillWriting) {
		t.Errorf("file appended to while read: err %v, want errStillWriting", err)
	}
	if _, err := streamFile(dir, "s.yaml", appendHalfway("\n---\nkind: [")); !errors.Is(err, errStillWriting) {
		t.Errorf("file broken while read: err %v, want errStillWriting, not the decode error", err)
	}
	writeFiles(t, dir, map[string]string{"s.yaml": "kind: ["})
	if _, err := streamFile(dir, "s.yaml", read); err == nil || errors.Is(err, errStillWriting) {
		t.Errorf("broken file: err %v, want its decode error", err)
	}
}

// TestLoadFileTakesBackTornRead: a file that changed while the first load
// read it takes back the objects it handed over, then loads again whole.
func TestLoadFileTakesBackTornRead(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"s.yaml": servicesYAML})
	log, _ := observed()
	tr := NewTracker(log, TrackerOptions{})
	w := newDirWatcher(dir, tr, log, time.Millisecond)
	reads := 0
	w.stream = func(dir, name string, decode func(io.Reader) error) ([32]byte, error) {
		reads++
		if reads == 1 {
			// The torn read: what the file held while it was written,
			// more objects than it holds once written (more than one
			// batch of them, so that some reached the tracker).
			var torn strings.Builder
			torn.WriteString(servicesYAML + "\n---\n" + sliceYAML)
			for i := range 600 {
				fmt.Fprintf(&torn, "\n---\napiVersion: v1\nkind: Service\nmetadata: {name: torn-%d}\nspec: {clusterIP: 10.96.1.%d, ports: [{port: 80}]}\n", i, i%250+1)
			}
			if err := decode(strings.NewReader(torn.String())); err != nil {
				return [32]byte{}, err
			}
			return [32]byte{}, &ManifestError{File: name, Err: errStillWriting}
		}
		return streamFile(dir, name, decode)
	}
	if err := w.loadAll(); err != nil {
		t.Fatal(err)
	}
	if reads != 2 {
		t.Errorf("file read %d times, want 2", reads)
	}
	snap := tr.Snapshot()
	if got := endpointAddrs(snap, "web"); got != "" {
		t.Errorf("web's endpoints %q, want none: the torn read's slice taken back", got)
	}
	for _, sp := range snap.Services {
		if strings.HasPrefix(sp.Name.Name, "torn-") {
			t.Fatalf("service %s of the torn read is still there", sp.Name)
		}
	}
	if _, ok := w.owner[KindEndpointSlice+" default/web-1"]; ok {
		t.Error("the torn read's slice still has an owner")
	}
	if w.files["s.yaml"].hash != sha256.Sum256([]byte(servicesYAML)) {
		t.Error("the file's hash is not its content's")
	}
}
