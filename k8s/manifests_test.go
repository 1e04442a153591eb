package k8s

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
)

const servicesYAML = `# two services and something nftproxy doesn't use
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
---
# only a comment
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: kube-system
spec:
  clusterIP: 10.96.0.53
  ports:
  - name: dns
    port: 53
    protocol: UDP
`

const sliceYAML = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: ["10.244.0.1"]
ports:
- name: http
  port: 8080
`

const nodeJSON = `{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}},
 "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}}`

const listYAML = `apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: dns-1
    namespace: kube-system
    labels:
      kubernetes.io/service-name: dns
  addressType: IPv4
  endpoints:
  - addresses: ["10.244.0.53"]
  ports:
  - name: dns
    port: 53
    protocol: UDP
- apiVersion: v1
  kind: Node
  metadata:
    name: node-b
`

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		// Write and rename, as an editor or a ConfigMap update would, so
		// the watcher never sees half a file.
		tmp := filepath.Join(dir, ".tmp-"+filepath.Base(name))
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func goodDir(t *testing.T) string {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"services.yaml":    servicesYAML,
		"slices.yml":       sliceYAML,
		"node.json":        nodeJSON,
		"list.yaml":        listYAML,
		".hidden.yaml":     "{{{ not yaml",
		"README.txt":       "{{{ not yaml either",
		"sub/ignored.yaml": "{{{",
	})
	return dir
}

func TestLoadDir(t *testing.T) {
	services, slices, nodes, err := LoadDir(goodDir(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range services {
		got = append(got, "Service "+s.Namespace+"/"+s.Name)
	}
	for _, s := range slices {
		got = append(got, "EndpointSlice "+s.Namespace+"/"+s.Name)
	}
	for _, n := range nodes {
		got = append(got, "Node "+n.Name+" "+n.Labels["topology.kubernetes.io/zone"])
	}
	// Files in name order, documents in file order.
	want := []string{"Service default/web", "Service kube-system/dns",
		"EndpointSlice kube-system/dns-1", "EndpointSlice default/web-1",
		"Node node-b ", "Node node-a z1"}
	if diff := cmp.Diff(want, sortedByKind(got)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if *slices[1].Ports[0].Port != 8080 || slices[1].AddressType != "IPv4" {
		t.Errorf("slice decoded wrong: %+v", slices[1])
	}
}

// sortedByKind keeps the order within each kind, services first.
func sortedByKind(s []string) []string {
	var out []string
	for _, kind := range []string{"Service ", "EndpointSlice ", "Node "} {
		for _, x := range s {
			if strings.HasPrefix(x, kind) {
				out = append(out, x)
			}
		}
	}
	return out
}

func TestLoadDirErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		file  string // the file the error must name
		want  string // in the message
	}{
		{"bad YAML", map[string]string{"a.yaml": servicesYAML, "b.yaml": "kind: Service\n  bad: [indent"}, "b.yaml", "document 1"},
		{"bad YAML in the third document", map[string]string{"a.yaml": sliceYAML + "---\n" + nodeJSON + "\n---\n: : :\n"}, "a.yaml", "document 3"},
		{"no kind", map[string]string{"a.json": `{"metadata": {"name": "x"}}`}, "a.json", "apiVersion and kind are required"},
		{"wrong field type", map[string]string{"a.yaml": strings.Replace(sliceYAML, "port: 8080", "port: http", 1)}, "a.yaml", "decode EndpointSlice"},
		{"defined twice", map[string]string{"a.yaml": sliceYAML, "b.yaml": sliceYAML}, "b.yaml", "EndpointSlice default/web-1 defined twice"},
		{"bad List item", map[string]string{"l.yaml": "apiVersion: v1\nkind: List\nitems:\n- kind: Service\n"}, "l.yaml", "items[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			_, _, _, err := LoadDir(dir)
			var me *ManifestError
			if !errors.As(err, &me) || me.File != tt.file || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want a ManifestError on %s saying %q", err, tt.file, tt.want)
			}
		})
	}
	if _, _, _, err := LoadDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("no error for a missing directory")
	}
}

func TestWatchDirStartErrors(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	if err := WatchDir(t.Context(), filepath.Join(t.TempDir(), "missing"), tr, nil, 0); err == nil {
		t.Error("no error for a missing directory")
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": "{{{"})
	if err := WatchDir(t.Context(), dir, tr, nil, 0); err == nil || !strings.Contains(err.Error(), "a.yaml") {
		t.Errorf("err = %v, want one naming a.yaml", err)
	}
	if n := len(tr.Snapshot().Services); n != 0 {
		t.Errorf("%d services applied from a broken directory", n)
	}
	for _, objects := range []string{sliceYAML, nodeJSON} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"a.yaml": objects, "b.yaml": objects})
		err := WatchDir(t.Context(), dir, NewTracker(nil, TrackerOptions{}), nil, 0)
		var me *ManifestError
		if !errors.Is(err, ErrDuplicate) || !errors.As(err, &me) || me.File != "b.yaml" {
			t.Errorf("err = %v, want a duplicate in b.yaml", err)
		}
	}
}

// waitChange waits for the tracker to signal and returns how long it took.
func waitChange(t *testing.T, tr *Tracker, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-tr.Changed():
	case <-time.After(3 * time.Second):
		t.Fatalf("%s: no change after 3s", what)
	}
	return time.Since(start)
}

func TestWatchDir(t *testing.T) {
	dir := goodDir(t)
	log, logs := observed()
	tr := NewTracker(log, TrackerOptions{FallbackNode: Node{Name: "node-a"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := WatchDir(ctx, dir, tr, log, 0); err != nil {
		t.Fatal(err)
	}
	snap := tr.Snapshot()
	if got := endpointNames(snap); got != "default/web:http kube-system/dns:dns" {
		t.Fatalf("services %q", got)
	}
	if got := endpointAddrs(snap, "web") + " " + endpointAddrs(snap, "dns"); got != "10.244.0.1 10.244.0.53" {
		t.Errorf("endpoints %q", got)
	}
	if snap.Node.Zone != "z1" {
		t.Errorf("node %+v, want node-a from node.json", snap.Node)
	}
	if logs.FilterMessage("Ignoring manifest of an unused kind").Len() != 1 {
		t.Error("the Deployment was not logged as ignored")
	}
	drain(tr)

	// An endpoint added: picked up within a second.
	writeFiles(t, dir, map[string]string{"slices.yml": strings.Replace(sliceYAML,
		`- addresses: ["10.244.0.1"]`, `- addresses: ["10.244.0.1"]`+"\n"+`- addresses: ["10.244.0.2"]`, 1)})
	if d := waitChange(t, tr, "endpoint added"); d > time.Second {
		t.Errorf("change took %v", d)
	}
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1 10.244.0.2" {
		t.Errorf("endpoints %q", got)
	}

	// Broken YAML: the file keeps its last good objects, and is named.
	good := tr.Snapshot()
	writeFiles(t, dir, map[string]string{"services.yaml": servicesYAML + "\n---\nkind: [unclosed\n"})
	deadline := time.Now().Add(3 * time.Second)
	for logs.FilterMessage("Cannot load manifest file, keeping its last good objects").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("broken file not reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	entry := logs.FilterMessage("Cannot load manifest file, keeping its last good objects").All()[0]
	if entry.ContextMap()["file"] != "services.yaml" {
		t.Errorf("log names %v, want services.yaml", entry.ContextMap())
	}
	time.Sleep(4 * DefaultSettle)
	if tr.Snapshot() != good {
		t.Error("snapshot changed while the only changed file was broken")
	}
	if n := logs.FilterMessage("Cannot load manifest file, keeping its last good objects").Len(); n != 1 {
		t.Errorf("broken file logged %d times, want once", n)
	}

	// Fixed, minus the dns service: applied.
	fixed := servicesYAML[:strings.Index(servicesYAML, "---\n# only")]
	writeFiles(t, dir, map[string]string{"services.yaml": fixed})
	waitChange(t, tr, "directory fixed")
	if got := endpointNames(tr.Snapshot()); got != "default/web:http" {
		t.Errorf("services %q", got)
	}

	// A file removed.
	if err := os.Remove(filepath.Join(dir, "slices.yml")); err != nil {
		t.Fatal(err)
	}
	waitChange(t, tr, "file removed")
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "" {
		t.Errorf("endpoints %q after removing their file", got)
	}

	// In-place rewrites (not rename) are seen too.
	if err := os.WriteFile(filepath.Join(dir, "slices.yml"), []byte(sliceYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	waitChange(t, tr, "file rewritten in place")
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1" {
		t.Errorf("endpoints %q", got)
	}
}

func TestWatchDirStops(t *testing.T) {
	dir := goodDir(t)
	tr := NewTracker(zap.NewNop(), TrackerOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	if err := WatchDir(ctx, dir, tr, nil, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	drain(tr)
	cancel()
	time.Sleep(100 * time.Millisecond)
	writeFiles(t, dir, map[string]string{"slices.yml": ""})
	select {
	case <-tr.Changed():
		t.Error("change applied after the context ended")
	case <-time.After(500 * time.Millisecond):
	}
}

func TestDecodeUnknownFieldWarns(t *testing.T) {
	typo := strings.Replace(sliceYAML, "addressType:", "adressType: IPv4\naddressType:", 1)
	m, err := decodeFile("typo.yaml", []byte(typo))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.slices) != 1 || len(m.warnings) != 1 || !strings.Contains(m.warnings[0].Error(), "adressType") {
		t.Errorf("slices %d, warnings %v; want the slice and a warning naming the typo", len(m.slices), m.warnings)
	}
}
