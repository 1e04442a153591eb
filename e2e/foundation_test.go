package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

var (
	webVIP   = netip.MustParseAddrPort("10.96.0.10:80")
	nodePort = netip.AddrPortFrom(netns.NodeAddr, 30080)
)

func webManifests(endpoints ...string) map[string]string {
	return map[string]string{"web.yaml": svcSpec{name: "web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: endpoints}.yaml()}
}

// askMany asks addr n times from ns and counts the answers per name.
func (s *scenario) askMany(ns *netns.NS, addr netip.AddrPort, n int) map[string]int {
	s.t.Helper()
	counts := map[string]int{}
	for range n {
		name, err := ns.AskTCP(s.ctx, addr)
		if err != nil {
			s.t.Fatalf("ask %s: %v", addr, err)
		}
		counts[name]++
	}
	return counts
}

func TestClusterIPSpreadsOverEndpoints(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10", "10.244.1.11"))
	counts := s.askMany(s.topo.Client, webVIP, 200)
	for _, p := range s.topo.Pods {
		if counts[p.Name] < 60 {
			t.Errorf("%s got %d of 200 connections, want at least 30%%: %v", p.Name, counts[p.Name], counts)
		}
	}
}

func TestNodePortOnNodeAddress(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10", "10.244.1.11"))
	counts := s.askMany(s.topo.Client, nodePort, 20)
	if len(counts) == 0 || counts[""] > 0 {
		t.Fatalf("NodePort answers: %v", counts)
	}
	for name := range counts {
		if !strings.HasPrefix(name, "e2e") && !strings.Contains(name, "pod") {
			t.Errorf("unexpected answer %q", name)
		}
	}
}

func TestHairpin(t *testing.T) {
	// The only endpoint asks its own service and must get its own answer.
	s := newScenario(t, 2, webManifests("10.244.1.10"))
	pod := s.topo.Pods[0]
	for range 5 {
		name, err := pod.NS.AskTCP(s.ctx, webVIP)
		if err != nil {
			t.Fatalf("pod reaching itself through its ClusterIP: %v", err)
		}
		if name != pod.Name {
			t.Fatalf("answer %q, want %q", name, pod.Name)
		}
	}
}

func TestSourceAddressPreservedInClusterMasqueradedOutside(t *testing.T) {
	s := newScenario(t, 1, webManifests("10.244.1.10"))
	peer := func(ns *netns.NS) netip.Addr {
		t.Helper()
		sess, err := ns.ConnectTCP(s.ctx, netip.AddrPort{}, webVIP)
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		got, err := sess.Echo(s.ctx, netns.PeerQuery)
		if err != nil {
			t.Fatal(err)
		}
		return netip.MustParseAddrPort(got).Addr()
	}
	inCluster := s.topo.InClusterClient
	if got := peer(inCluster.NS); got != inCluster.Addr {
		t.Errorf("pod saw in-cluster client as %s, want its own address %s", got, inCluster.Addr)
	}
	if got := peer(s.topo.Client); got == netns.ClientAddr || got != netns.BridgeAddr {
		t.Errorf("pod saw the outside client as %s, want it masqueraded to %s", got, netns.BridgeAddr)
	}
}

func TestUDP(t *testing.T) {
	s := newScenario(t, 2, map[string]string{"dns.yaml": svcSpec{name: "dns", clusterIP: "10.96.0.53", proto: "UDP", port: 53,
		endpoints: []string{"10.244.1.10", "10.244.1.11"}}.yaml()})
	seen := map[string]bool{}
	for range 40 {
		name, err := s.topo.Client.AskUDP(s.ctx, netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.53:53"))
		if err != nil {
			t.Fatal(err)
		}
		seen[name] = true
	}
	if len(seen) != 2 {
		t.Errorf("UDP answers from %v, want both pods", seen)
	}
}

func TestNoEndpointsRefusesAtOnce(t *testing.T) {
	s := newScenario(t, 1, webManifests())
	for _, addr := range []netip.AddrPort{webVIP, nodePort} {
		start := time.Now()
		_, err := s.topo.Client.AskTCP(s.ctx, addr)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: error %v, want connection refused", addr, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: refusal took %s", addr, took)
		}
	}
	_, err := s.topo.Client.AskUDP(s.ctx, netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.10:80"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a TCP-only service: %v, want ICMP port unreachable", err)
	}
}

func TestRemovedEndpointGetsNoNewConnections(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10", "10.244.1.11"))
	s.change(func() { s.write("web.yaml", webManifests("10.244.1.10")["web.yaml"]) })
	counts := s.askMany(s.topo.Client, webVIP, 50)
	if counts[s.topo.Pods[1].Name] > 0 || counts[s.topo.Pods[0].Name] != 50 {
		t.Errorf("after removing %s: %v", s.topo.Pods[1].Name, counts)
	}
}

func TestEndpointChangeIsASmallBatch(t *testing.T) {
	// 50 services around the one that changes: the batch must not grow with them.
	manifests := webManifests("10.244.1.10", "10.244.1.11")
	for i := range 50 {
		manifests[fmt.Sprintf("svc-%d.yaml", i)] = svcSpec{name: fmt.Sprintf("svc-%d", i), clusterIP: fmt.Sprintf("10.96.1.%d", i+1),
			port: 80, endpoints: []string{"10.244.1.10", "10.244.1.11"}}.yaml()
	}
	s := newScenario(t, 3, manifests)
	s.change(func() { s.write("web.yaml", webManifests("10.244.1.10", "10.244.1.12")["web.yaml"]) })
	var delta map[string]any
	for _, l := range s.logLines("Synced ruleset") {
		if l["kind"] == "delta" && l["family"] == "ip" {
			delta = l
		}
	}
	if delta == nil {
		t.Fatalf("no delta sync logged:\n%s", s.d.Log())
	}
	// Batch begin and end, and per data map (ClusterIP and NodePort slot)
	// one element out and one in: no chain, no rule, no verdict.
	if msgs := delta["messages"].(float64); msgs > 8 || delta["rules"].(float64) != 0 {
		t.Errorf("one endpoint replaced took %v messages and %v rules, want a few element messages", msgs, delta["rules"])
	}
	counts := s.askMany(s.topo.Client, webVIP, 60)
	if counts[s.topo.Pods[1].Name] > 0 || counts[s.topo.Pods[2].Name] == 0 {
		t.Errorf("after replacing pod-1 by pod-2: %v", counts)
	}
}

func TestBadObjectsAreSkipped(t *testing.T) {
	bad := map[string]string{
		"bad-ip.yaml":    svcSpec{name: "bad-ip", clusterIP: "10.96.0.300", port: 80, endpoints: []string{"10.244.1.10"}}.yaml(),
		"port-zero.yaml": svcSpec{name: "port-zero", clusterIP: "10.96.0.21", port: 0, endpoints: []string{"10.244.1.10"}}.yaml(),
		"proto.yaml":     svcSpec{name: "bad-proto", clusterIP: "10.96.0.22", proto: "ICMP", port: 80, endpoints: []string{"10.244.1.10"}}.yaml(),
		"slice-ip.yaml":  svcSpec{name: "bad-slice", clusterIP: "10.96.0.23", port: 80, endpoints: []string{"10.244.1.999"}}.yaml(),
		"no-port.yaml": `apiVersion: v1
kind: Service
metadata: {name: no-ports, namespace: default}
spec:
  clusterIP: 10.96.0.24
  ports:
  - name: p
    protocol: TCP
`,
	}
	manifests := webManifests("10.244.1.10")
	for k, v := range bad {
		manifests[k] = v
	}
	s := newScenario(t, 1, manifests)
	if name, err := s.topo.Client.AskTCP(s.ctx, webVIP); err != nil || name != s.topo.Pods[0].Name {
		t.Errorf("valid service next to bad ones: %q, %v", name, err)
	}
	log := s.d.Log()
	for _, name := range []string{"bad-ip", "port-zero", "bad-proto", "bad-slice", "no-ports"} {
		if !strings.Contains(log, name) {
			t.Errorf("log does not name the skipped object %s", name)
		}
	}
}

func TestPodsReachEveryEndpoint(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10", "10.244.1.11"))
	for _, from := range []*netns.Pod{s.topo.InClusterClient, s.topo.Pods[0]} {
		counts := s.askMany(from.NS, webVIP, 60)
		if len(counts) != 2 {
			t.Errorf("from %s (%s): answers %v, want both pods", from.Name, from.Addr, counts)
		}
	}
}

func TestStopLeavesRulesAndCleanupRemovesThem(t *testing.T) {
	s := newScenario(t, 1, webManifests("10.244.1.10"))
	if err := s.d.Stop(); err != nil {
		t.Fatal(err)
	}
	// SIGTERM leaves the rules: traffic keeps flowing while the daemon restarts.
	if name, err := s.topo.Client.AskTCP(s.ctx, webVIP); err != nil || name != s.topo.Pods[0].Name {
		t.Errorf("after SIGTERM: %q, %v; want the service still answering", name, err)
	}
	if out, err := s.topo.Node.Exec(binary, "cleanup"); err != nil {
		t.Fatalf("nftproxy cleanup: %v: %s", err, out)
	}
	if out, err := s.topo.Node.Exec(binary, "list"); err == nil || !strings.Contains(out, "no table nftproxy") {
		t.Errorf("nftproxy list after cleanup: %v, want no table:\n%s", err, out)
	}
	if out, err := s.topo.Node.Exec(binary, "cleanup"); err != nil {
		t.Errorf("a second cleanup must succeed too: %v: %s", err, out)
	}
}
