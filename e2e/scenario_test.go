package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/manifest"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// binary is the nftproxy built once for all scenarios (empty when not root).
var binary string

func TestMain(m *testing.M) { os.Exit(RunTests(m, &binary)) }

// startUntilCleanup starts nftproxy in ns with the environment env (nil:
// the test's); the test's end stops it, reports a failed stop, and shows
// the daemon's log if the test failed.
func startUntilCleanup(t testing.TB, ns *netns.NS, env []string, args ...string) *Daemon {
	t.Helper()
	d, err := StartWithEnv(ns, env, binary, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, d)
	return d
}

// stopAtCleanup stops d when the test ends, reports a failed stop, and
// shows the daemon's log if the test failed.
func stopAtCleanup(t testing.TB, d *Daemon) {
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("nftproxy log:\n%s", d.Log())
		}
	})
}

// startOnManifest runs nftproxy in topo's node namespace as node-1 on a
// manifest directory holding manifest, without health or metrics servers,
// and waits (within ctx) for its first sync. The test's end stops it.
func startOnManifest(ctx context.Context, t *testing.T, topo *netns.Topology, manifest string, args ...string) *Daemon {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Start(topo.Node, binary, append([]string{"--manifests", dir, "--hostname-override", clusterNode,
		"--cluster-cidr", "10.244.0.0/16", "--healthz-bind-address", "", "--metrics-bind-address", ""}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Stop()
		if t.Failed() {
			t.Logf("nftproxy log:\n%s", d.Log())
		}
	})
	if err := d.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return d
}

// scenario is a topology with nftproxy running in its node namespace from a
// manifest directory the test writes.
type scenario struct {
	t    testing.TB
	topo *netns.Topology
	dir  string
	d    *Daemon
	ctx  context.Context
}

// newScenario builds the topology (pods serve their names on tcp/8080 and
// udp/5353), writes the manifests and starts nftproxy, waiting for its first sync.
func newScenario(t testing.TB, pods int, manifests map[string]string, args ...string) *scenario {
	t.Helper()
	if binary == "" {
		netns.Require(t) // skips in -short mode before probing
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	s := &scenario{t: t, topo: netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2e", Pods: pods, InClusterClient: true}),
		dir: t.TempDir(), ctx: ctx}
	for _, p := range s.topo.Pods {
		for _, proto := range []string{"tcp", "udp"} {
			port := 8080
			if proto == "udp" {
				port = 5353
			}
			if _, err := p.ServeName(proto, port); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range manifests {
		s.write(name, content)
	}
	base := []string{"--manifests", s.dir, "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249", "--min-sync-period", "100ms", "-v", "2"}
	d := startUntilCleanup(t, s.topo.Node, nil, append(base, args...)...)
	s.d = d
	if err := d.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return s
}

// write replaces a manifest file atomically, so the daemon never reads half of it.
func (s *scenario) write(name, content string) {
	s.t.Helper()
	tmp := filepath.Join(s.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
		s.t.Fatal(err)
	}
}

// change runs f (which edits the manifests) and waits for the sync that
// applies an edit: one that saw service or endpoint changes.
func (s *scenario) change(f func()) {
	s.t.Helper()
	n := len(s.changedSyncs())
	f()
	for len(s.changedSyncs()) <= n {
		select {
		case <-s.ctx.Done():
			s.t.Fatalf("no sync applied the change; log:\n%s", s.d.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// changedSyncs are the logged syncs that applied some change.
func (s *scenario) changedSyncs() []map[string]any {
	var out []map[string]any
	for _, l := range s.logLines("Synced") {
		if l["serviceChanges"].(float64)+l["endpointChanges"].(float64) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// logLines returns the daemon's JSON log lines with the given message.
func (s *scenario) logLines(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.d.Log()))
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// service returns the manifests of a service with one port and a slice of
// the given endpoint addresses (all ready, on node-1).
type svcSpec struct {
	name, clusterIP, proto string
	port, targetPort       int
	nodePort               int
	endpoints              []string
	extraSpec              string // more YAML lines under spec, indented by two spaces
}

func (sp svcSpec) yaml() string {
	if sp.proto == "" {
		sp.proto = "TCP"
	}
	if sp.targetPort == 0 {
		sp.targetPort = 8080
		if sp.proto == "UDP" {
			sp.targetPort = 5353
		}
	}
	return manifest.Service{Namespace: "default", Name: sp.name, ClusterIP: sp.clusterIP, Proto: sp.proto, PortName: "p",
		Port: sp.port, TargetPort: sp.targetPort, NodePort: sp.nodePort, ExtraSpec: sp.extraSpec,
		Slice: sp.name + "-1", ManagedBy: "e2e", Endpoints: sp.endpoints,
		Endpoint: "  conditions: {ready: true}\n  nodeName: node-1\n"}.YAML()
}
