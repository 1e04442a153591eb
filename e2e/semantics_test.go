package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Addresses the client routes through the node (its default route) without
// any of them being on a link: what a load balancer or a router would send.
var (
	semLBIP       = netip.MustParseAddr("192.168.200.10")
	semExternalIP = netip.MustParseAddr("192.168.201.10")
)

// semNode is the Node the daemon runs as: node-1 in zone-a, with the
// client-facing address as its InternalIP.
const semNode = `apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels:
    topology.kubernetes.io/zone: zone-a
status:
  addresses:
  - type: InternalIP
    address: 192.168.77.1
`

// semEP is one endpoint of a slice.
type semEP struct {
	addr  string
	node  string // nodeName; node-1 when empty
	cond  string // conditions, YAML flow style; {ready: true} when empty
	hints string // hints, YAML flow style; none when empty
}

// semSvc is a Service with port p (80/TCP to 8080) and its EndpointSlices,
// one per address family.
type semSvc struct {
	name       string
	typ        string // ClusterIP when empty
	clusterIPs []string
	nodePort   int
	spec       string // more lines under spec, each indented by two spaces
	lbIP       string // status.loadBalancer.ingress[0].ip
	v4, v6     []semEP
}

func (s semSvc) yaml() string {
	typ := s.typ
	if typ == "" {
		typ = "ClusterIP"
	}
	np := ""
	if s.nodePort != 0 {
		np = fmt.Sprintf("\n    nodePort: %d", s.nodePort)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: default
spec:
  type: %s
  clusterIP: %s
  clusterIPs: [%s]
  ports:
  - name: p
    protocol: TCP
    port: 80
    targetPort: 8080%s
%s`, s.name, typ, s.clusterIPs[0], strings.Join(s.clusterIPs, ", "), np, s.spec)
	if s.lbIP != "" {
		fmt.Fprintf(&b, "status:\n  loadBalancer:\n    ingress:\n    - ip: %s\n", s.lbIP)
	}
	for _, sl := range []struct {
		family string
		eps    []semEP
	}{{"IPv4", s.v4}, {"IPv6", s.v6}} {
		if sl.eps == nil {
			continue
		}
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-%s
  namespace: default
  labels:
    kubernetes.io/service-name: %s
addressType: %s
ports:
- name: p
  protocol: TCP
  port: 8080
endpoints:
`, s.name, strings.ToLower(sl.family), s.name, sl.family)
		if len(sl.eps) == 0 {
			b.WriteString("[]\n")
		}
		for _, e := range sl.eps {
			node, cond := e.node, e.cond
			if node == "" {
				node = "node-1"
			}
			if cond == "" {
				cond = "{ready: true}"
			}
			fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: %s\n  nodeName: %s\n", e.addr, cond, node)
			if e.hints != "" {
				fmt.Fprintf(&b, "  hints: %s\n", e.hints)
			}
		}
	}
	return b.String()
}

// semEPs are ready endpoints on node-1 at the given addresses.
func semEPs(addrs ...netip.Addr) []semEP {
	out := make([]semEP, len(addrs))
	for i, a := range addrs {
		out[i] = semEP{addr: a.String()}
	}
	return out
}

// semAddrs are the IPv4 addresses of the pods.
func semAddrs(pods ...*netns.Pod) []netip.Addr {
	var out []netip.Addr
	for _, p := range pods {
		out = append(out, p.Addr)
	}
	return out
}

// semAnswered asks addr n times from ns (from local when valid) and returns
// the sorted names that answered.
func (s *scenario) semAnswered(ns *netns.NS, local netip.Addr, addr netip.AddrPort, n int) []string {
	s.t.Helper()
	seen := map[string]bool{}
	for range n {
		name, err := s.semAsk(ns, local, addr)
		if err != nil {
			s.t.Fatalf("ask %s from %s %s: %v", addr, ns, local, err)
		}
		seen[name] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// semWantAnswers checks that n connections from ns to addr are answered by
// exactly the pods named want.
func (s *scenario) semWantAnswers(what string, ns *netns.NS, local netip.Addr, addr netip.AddrPort, n int, want ...string) {
	s.t.Helper()
	slices.Sort(want)
	if got := s.semAnswered(ns, local, addr, n); !slices.Equal(got, want) {
		s.t.Errorf("%s: %d connections to %s answered by %v, want %v", what, n, addr, got, want)
	}
}

// semAsk is one AskTCPFrom that gives up after two seconds (the scenario's
// own deadline is minutes away).
func (s *scenario) semAsk(ns *netns.NS, local netip.Addr, addr netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	return ns.AskTCPFrom(ctx, netip.AddrPortFrom(local, 0), addr)
}

// semPeer returns the client address the endpoint behind addr sees.
func (s *scenario) semPeer(ns *netns.NS, local netip.Addr, addr netip.AddrPort) netip.Addr {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	sess, err := ns.ConnectTCP(ctx, netip.AddrPortFrom(local, 0), addr)
	if err != nil {
		s.t.Fatalf("connect %s: %v", addr, err)
	}
	defer sess.Close()
	peer, err := sess.Peer(ctx)
	if err != nil {
		s.t.Fatalf("ask the peer over %s: %v", addr, err)
	}
	return peer.Addr()
}

// semWantDropped checks that a connection to addr gets no answer at all (a
// drop, neither a refusal nor an unreachable error).
func (s *scenario) semWantDropped(what string, ns *netns.NS, local netip.Addr, addr netip.AddrPort) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 400*time.Millisecond)
	defer cancel()
	name, err := ns.AskTCPFrom(ctx, netip.AddrPortFrom(local, 0), addr)
	if !netns.IsTimeout(err) {
		s.t.Errorf("%s: %s answered %q, %v; want it dropped (no answer)", what, addr, name, err)
	}
}

// semWantRefused checks that a connection to addr is refused at once.
func (s *scenario) semWantRefused(what string, ns *netns.NS, addr netip.AddrPort) {
	s.t.Helper()
	name, err := s.semAsk(ns, netip.Addr{}, addr)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		s.t.Errorf("%s: %s answered %q, %v; want connection refused", what, addr, name, err)
	}
}

// semRouteVia makes the node namespace route prefix to the client, as a node
// would route a load balancer's address: only then do its own connections to
// that address reach the output hook.
func (s *scenario) semRouteVia(prefix string) {
	s.t.Helper()
	if _, err := s.topo.Node.IP("route", "add", prefix, "via", netns.ClientAddr.String()); err != nil {
		s.t.Fatal(err)
	}
}

func TestSemLoadBalancerAndExternalIPs(t *testing.T) {
	web := semSvc{name: "web", typ: "LoadBalancer", clusterIPs: []string{"10.96.0.10"}, nodePort: 30080,
		spec: "  externalIPs: [" + semExternalIP.String() + "]\n", lbIP: semLBIP.String()}
	s := newScenario(t, 2, nil)
	web.v4 = semEPs(semAddrs(s.topo.Pods...)...)
	s.change(func() { s.write("web.yaml", web.yaml()); s.write("node.yaml", semNode) })
	both := []string{s.topo.Pods[0].Name, s.topo.Pods[1].Name}
	for _, vip := range []netip.Addr{semLBIP, semExternalIP} {
		addr := netip.AddrPortFrom(vip, 80)
		s.semWantAnswers("client to "+vip.String(), s.topo.Client, netip.Addr{}, addr, 40, both...)
		// External traffic is masqueraded, from outside and from pods alike.
		if got := s.semPeer(s.topo.Client, netip.Addr{}, addr); got != netns.BridgeAddr {
			t.Errorf("the pod saw the client's connection to %s come from %s, want it masqueraded to %s", vip, got, netns.BridgeAddr)
		}
		if got := s.semPeer(s.topo.InClusterClient.NS, netip.Addr{}, addr); got != netns.BridgeAddr {
			t.Errorf("the pod saw the in-cluster client's connection to %s come from %s, want it masqueraded to %s", vip, got, netns.BridgeAddr)
		}
		// Another port of the address is not the service's: nothing is
		// programmed for it, so the node has no route and says so.
		_, err := s.semAsk(s.topo.Client, netip.Addr{}, netip.AddrPortFrom(vip, 81))
		if err == nil || netns.IsTimeout(err) {
			t.Errorf("%s:81 (no service port): %v, want an unreachable error", vip, err)
		}
	}
}

func TestSemLoadBalancerSourceRanges(t *testing.T) {
	lb := netip.AddrPortFrom(semLBIP, 80)
	web := semSvc{name: "web", typ: "LoadBalancer", clusterIPs: []string{"10.96.0.10"}, nodePort: 30080, lbIP: semLBIP.String(),
		spec: "  loadBalancerSourceRanges: [192.168.77.2/32]\n"}
	s := newScenario(t, 1, map[string]string{"node.yaml": semNode})
	s.semRouteVia("192.168.200.0/24")
	pod := s.topo.Pods[0].Name
	web.v4 = semEPs(s.topo.Pods[0].Addr)
	s.change(func() { s.write("web.yaml", web.yaml()) })

	// The client is in the range; the node is not, and none of its
	// addresses is.
	s.semWantAnswers("client in the range", s.topo.Client, netip.Addr{}, lb, 5, pod)
	s.semWantDropped("node (no address in the ranges)", s.topo.Node, netip.Addr{}, lb)

	// A connection the client opened while allowed outlives its range, as
	// with kube-proxy: only new connections are checked.
	sess, err := s.topo.Client.ConnectTCP(s.ctx, netip.AddrPort{}, lb)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()

	// The node's addresses in the ranges pass like any source; the client
	// is no longer allowed. NodePorts are not filtered.
	web.spec = "  loadBalancerSourceRanges: [10.0.0.0/8, 192.168.77.1/32]\n"
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantDropped("client outside the ranges", s.topo.Client, netip.Addr{}, lb)
	if got, err := sess.Echo(s.ctx, "still open"); err != nil || got != "still open" {
		t.Errorf("connection opened in the range, after the range went: %q, %v; want it kept", got, err)
	}
	s.semWantAnswers("client to the NodePort", s.topo.Client, netip.Addr{}, nodePort, 5, pod)
	s.semWantAnswers("node from its address in the range", s.topo.Node, netns.NodeAddr, lb, 5, pod)
	s.semWantAnswers("node from its bridge address (in 10.0.0.0/8)", s.topo.Node, netns.BridgeAddr, lb, 5, pod)
	// A pod's address is in 10.0.0.0/8.
	s.semWantAnswers("pod in the range", s.topo.InClusterClient.NS, netip.Addr{}, lb, 5, pod)

	// Like kube-proxy, a range holding a node address lets the load
	// balancer's own address through as a source (the node holding it),
	// not every local address: the bridge address is outside the range.
	web.spec = "  loadBalancerSourceRanges: [192.168.77.1/32]\n"
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantAnswers("node from its address in the range, again", s.topo.Node, netns.NodeAddr, lb, 5, pod)
	s.semWantDropped("node from its bridge address (outside the range)", s.topo.Node, netns.BridgeAddr, lb)
}

// semAffinity is the spec of a ClientIP affinity, with the default timeout
// when seconds is 0.
func semAffinity(seconds int) string {
	if seconds == 0 {
		return "  sessionAffinity: ClientIP\n"
	}
	return fmt.Sprintf("  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: %d\n", seconds)
}

func TestSemSessionAffinity(t *testing.T) {
	s := newScenario(t, 3, nil)
	web := semSvc{name: "web", typ: "NodePort", clusterIPs: []string{"10.96.0.10"}, nodePort: 30080, spec: semAffinity(0),
		v4: semEPs(semAddrs(s.topo.Pods...)...)}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	one := func(what string, addr netip.AddrPort) string {
		t.Helper()
		got := s.semAnswered(s.topo.Client, netip.Addr{}, addr, 50)
		if len(got) != 1 {
			t.Fatalf("%s: 50 connections from one client to %s reached %v, want one pod", what, addr, got)
		}
		return got[0]
	}
	one("ClientIP with the default timeout", webVIP)
	one("ClientIP with the default timeout", nodePort)

	web.spec = ""
	s.change(func() { s.write("web.yaml", web.yaml()) })
	if got := s.semAnswered(s.topo.Client, netip.Addr{}, webVIP, 50); len(got) < 2 {
		t.Errorf("after switching to None: 50 connections reached only %v", got)
	}

	web.spec = semAffinity(600)
	s.change(func() { s.write("web.yaml", web.yaml()) })
	sources := s.semSources(12)
	picks := s.semStickyPicks("after switching back to ClientIP", sources, 2)
	// Different clients spread: that all 12 pick one of 3 pods has odds 3^-11.
	if spread := len(slices.Compact(slices.Sorted(maps.Values(picks)))); spread < 2 {
		t.Errorf("12 clients all stuck to one pod: %v", picks)
	}

	// Removing an endpoint releases its clients to the others; the clients
	// of the others keep theirs.
	gone := picks[sources[0]]
	var rest []netip.Addr
	for _, p := range s.topo.Pods {
		if p.Name != gone {
			rest = append(rest, p.Addr)
		}
	}
	web.v4 = semEPs(rest...)
	s.change(func() { s.write("web.yaml", web.yaml()) })
	after := s.semStickyPicks("after removing "+gone, sources, 2)
	for _, src := range sources {
		switch {
		case after[src] == gone:
			t.Errorf("client %s still reaches the removed endpoint %s", src, gone)
		case picks[src] != gone && after[src] != picks[src]:
			t.Errorf("client %s moved from %s to %s when another endpoint was removed", src, picks[src], after[src])
		}
	}
}

// semSources gives the client n more addresses (192.168.77.30 on), each a
// client of its own for affinity.
func (s *scenario) semSources(n int) []netip.Addr {
	s.t.Helper()
	var out []netip.Addr
	var cmds []string
	for i := range n {
		a := netip.AddrFrom4([4]byte{192, 168, 77, byte(30 + i)})
		out = append(out, a)
		cmds = append(cmds, fmt.Sprintf("addr add %s/24 dev %s", a, netns.PodIface))
	}
	if err := s.topo.Client.IPBatch(cmds...); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// semStickyPicks has every source connect rounds times, checks that each
// reaches a single pod, and returns it per source.
func (s *scenario) semStickyPicks(what string, sources []netip.Addr, rounds int) map[netip.Addr]string {
	s.t.Helper()
	picks := map[netip.Addr]string{}
	for range rounds {
		for _, src := range sources {
			name, err := s.semAsk(s.topo.Client, src, webVIP)
			if err != nil {
				s.t.Fatalf("%s: ask from %s: %v", what, src, err)
			}
			if prev, ok := picks[src]; ok && prev != name {
				s.t.Errorf("%s: client %s moved from %s to %s", what, src, prev, name)
			}
			picks[src] = name
		}
	}
	return picks
}

func TestSemAffinityTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	s := newScenario(t, 3, nil)
	sources := s.semSources(12)
	web := semSvc{name: "web", clusterIPs: []string{"10.96.0.10"}, spec: semAffinity(0), v4: semEPs(semAddrs(s.topo.Pods...)...)}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	// Changing the timeout of a live service takes effect.
	web.spec = semAffinity(int(timeout / time.Second))
	s.change(func() { s.write("web.yaml", web.yaml()) })
	start := time.Now()
	before := s.semStickyPicks("within the timeout", sources, 4)
	if took := time.Since(start); took > timeout {
		t.Fatalf("the connections took %s, longer than the %s timeout: inconclusive", took, timeout)
	}
	// After the timeout each client picks afresh: with 3 pods, that all 12
	// pick their old pod again has odds 3^-12.
	time.Sleep(timeout + 500*time.Millisecond)
	after := s.semStickyPicks("after the timeout", sources, 1)
	moved := 0
	for _, src := range sources {
		if after[src] != before[src] {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("after the %s timeout no client changed endpoint: %v", timeout, after)
	}
}

func TestSemAffinitySurvivesResync(t *testing.T) {
	s := newScenario(t, 3, nil, "--sync-period", "2s")
	sources := s.semSources(12)
	web := semSvc{name: "web", clusterIPs: []string{"10.96.0.10"}, spec: semAffinity(0), v4: semEPs(semAddrs(s.topo.Pods...)...)}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	before := s.semStickyPicks("before the resync", sources, 2)
	fulls := func() int {
		n := 0
		for _, l := range s.logLines("Synced") {
			if l["full"] == true {
				n++
			}
		}
		return n
	}
	n := fulls()
	// Any other nftables commit in the namespace makes the next periodic
	// resync a full one (without, it is skipped).
	for _, cmd := range [][]string{{"add", "table", "ip", "e2e-poke"}, {"delete", "table", "ip", "e2e-poke"}} {
		if out, err := s.topo.Node.Exec(append([]string{"nft"}, cmd...)...); err != nil {
			t.Fatalf("nft %v: %v\n%s", cmd, err, out)
		}
	}
	for fulls() == n {
		select {
		case <-s.ctx.Done():
			t.Fatal("no periodic full sync within the test's time")
		case <-time.After(50 * time.Millisecond):
		}
	}
	after := map[netip.Addr]string{}
	for _, src := range sources {
		name, err := s.semAsk(s.topo.Client, src, webVIP)
		if err != nil {
			t.Fatal(err)
		}
		after[src] = name
	}
	if !maps.Equal(before, after) {
		// A full sync that recreated the affinity sets would move most of
		// the 12 clients (odds that all land back: 3^-12).
		t.Errorf("a periodic full sync moved clients: before %v, after %v", before, after)
	}
}

func TestSemExternalTrafficPolicyLocal(t *testing.T) {
	s := newScenario(t, 2, map[string]string{"node.yaml": semNode})
	s.semRouteVia("192.168.200.0/24")
	local, remote := s.topo.Pods[0], s.topo.Pods[1]
	web := semSvc{name: "web", typ: "LoadBalancer", clusterIPs: []string{"10.96.0.10"}, nodePort: 30080, lbIP: semLBIP.String(),
		spec: "  externalTrafficPolicy: Local\n  healthCheckNodePort: 30999\n",
		v4:   []semEP{{addr: local.Addr.String()}, {addr: remote.Addr.String(), node: "node-2"}}}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	lb := netip.AddrPortFrom(semLBIP, 80)
	for _, addr := range []netip.AddrPort{lb, nodePort} {
		s.semWantAnswers("client (outside)", s.topo.Client, netip.Addr{}, addr, 20, local.Name)
		if got := s.semPeer(s.topo.Client, netip.Addr{}, addr); got != netns.ClientAddr {
			t.Errorf("through %s the pod saw the client as %s, want its own address %s", addr, got, netns.ClientAddr)
		}
	}
	// Pods and the node itself still reach every endpoint.
	s.semWantAnswers("in-cluster client", s.topo.InClusterClient.NS, netip.Addr{}, lb, 40, local.Name, remote.Name)
	s.semWantAnswers("the node", s.topo.Node, netip.Addr{}, lb, 40, local.Name, remote.Name)
	s.semWantAnswers("the node to its NodePort", s.topo.Node, netip.Addr{}, nodePort, 40, local.Name, remote.Name)
	s.semWantHealth(http.StatusOK, 1)

	// The local endpoint terminating but still serving keeps taking outside
	// traffic while no other local one is ready; pods get the ready ones.
	web.v4[0].cond = "{ready: false, serving: true, terminating: true}"
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantAnswers("client, local endpoint terminating", s.topo.Client, netip.Addr{}, lb, 20, local.Name)
	s.semWantAnswers("in-cluster client, local endpoint terminating", s.topo.InClusterClient.NS, netip.Addr{}, lb, 20, remote.Name)

	// No local endpoint left: outside traffic is dropped here, so the load
	// balancer's health check steers it to other nodes.
	web.v4[0] = semEP{addr: local.Addr.String(), node: "node-2"}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantDropped("client to the load balancer, no local endpoint", s.topo.Client, netip.Addr{}, lb)
	s.semWantDropped("client to the NodePort, no local endpoint", s.topo.Client, netip.Addr{}, nodePort)
	s.semWantAnswers("in-cluster client, no local endpoint", s.topo.InClusterClient.NS, netip.Addr{}, lb, 40, local.Name, remote.Name)
	s.semWantHealth(http.StatusServiceUnavailable, 0)
}

// semWantHealth polls the healthCheckNodePort (30999 on the node address)
// from the client until it answers status with localEndpoints local, as a
// cloud load balancer would ask it.
func (s *scenario) semWantHealth(status, local int) {
	s.t.Helper()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return s.topo.Client.Dial(ctx, network, addr)
		},
	}}
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("http://%s/", netip.AddrPortFrom(netns.NodeAddr, 30999))
	var last string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := client.Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		var body struct {
			Service struct {
				Namespace, Name string
			}
			LocalEndpoints      int
			ServiceProxyHealthy bool
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		last = fmt.Sprintf("status %d, body %+v, decode error %v", resp.StatusCode, body, err)
		if err == nil && resp.StatusCode == status && body.LocalEndpoints == local &&
			body.Service.Namespace == "default" && body.Service.Name == "web" && body.ServiceProxyHealthy {
			return
		}
	}
	s.t.Errorf("health check %s: %s; want status %d with localEndpoints %d for default/web", url, last, status, local)
}

func TestSemInternalTrafficPolicyLocal(t *testing.T) {
	s := newScenario(t, 2, nil)
	local, remote := s.topo.Pods[0], s.topo.Pods[1]
	web := semSvc{name: "web", clusterIPs: []string{"10.96.0.10"}, spec: "  internalTrafficPolicy: Local\n",
		v4: []semEP{{addr: local.Addr.String()}, {addr: remote.Addr.String(), node: "node-2"}}}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantAnswers("in-cluster client", s.topo.InClusterClient.NS, netip.Addr{}, webVIP, 40, local.Name)

	web.v4[0].node = "node-2"
	s.change(func() { s.write("web.yaml", web.yaml()) })
	s.semWantDropped("in-cluster client, no local endpoint", s.topo.InClusterClient.NS, netip.Addr{}, webVIP)
}

func TestSemEndpointChoice(t *testing.T) {
	zone := func(z string) string { return fmt.Sprintf("{forZones: [{name: %s}]}", z) }
	zoneNode := func(z, n string) string {
		return fmt.Sprintf("{forZones: [{name: %s}], forNodes: [{name: %s}]}", z, n)
	}
	notReady := "{ready: false}"
	servingTerminating := "{ready: false, serving: true, terminating: true}"
	tests := []struct {
		name string
		spec string
		eps  [3]semEP // addresses filled in: pod-0, pod-1, pod-2
		want []int    // pods reached
	}{
		{name: "ready endpoints only", eps: [3]semEP{{}, {cond: notReady}, {}}, want: []int{0, 2}},
		{name: "terminating ones unused while one is ready",
			eps: [3]semEP{{}, {cond: servingTerminating}, {cond: servingTerminating}}, want: []int{0}},
		{name: "serving terminating ones when none is ready",
			eps:  [3]semEP{{cond: servingTerminating}, {cond: "{ready: false, serving: false, terminating: true}"}, {cond: servingTerminating}},
			want: []int{0, 2}},
		{name: "PreferClose keeps this zone", spec: "  trafficDistribution: PreferClose\n",
			eps: [3]semEP{{hints: zone("zone-a")}, {hints: zone("zone-b")}, {hints: zone("zone-a")}}, want: []int{0, 2}},
		{name: "PreferSameZone keeps this zone", spec: "  trafficDistribution: PreferSameZone\n",
			eps: [3]semEP{{hints: zone("zone-b")}, {hints: zone("zone-a")}, {hints: zone("zone-b")}}, want: []int{1}},
		{name: "hints for other zones only are ignored", spec: "  trafficDistribution: PreferClose\n",
			eps: [3]semEP{{hints: zone("zone-b")}, {hints: zone("zone-b")}, {hints: zone("zone-c")}}, want: []int{0, 1, 2}},
		{name: "an endpoint without hints disables them", spec: "  trafficDistribution: PreferClose\n",
			eps: [3]semEP{{hints: zone("zone-a")}, {}, {hints: zone("zone-b")}}, want: []int{0, 1, 2}},
		{name: "PreferSameNode keeps this node", spec: "  trafficDistribution: PreferSameNode\n",
			eps: [3]semEP{{node: "node-2", hints: zoneNode("zone-a", "node-2")}, {hints: zoneNode("zone-a", "node-1")},
				{node: "node-3", hints: zoneNode("zone-b", "node-3")}},
			want: []int{1}},
		{name: "node hints on some endpoints only are ignored", spec: "  trafficDistribution: PreferSameNode\n",
			eps: [3]semEP{{hints: zoneNode("zone-a", "node-1")}, {node: "node-2", hints: zone("zone-b")},
				{node: "node-3", hints: zone("zone-a")}},
			want: []int{0, 2}},
		{name: "PreferSameNode without an endpoint here falls back to the zone", spec: "  trafficDistribution: PreferSameNode\n",
			eps: [3]semEP{{node: "node-2", hints: zoneNode("zone-a", "node-2")}, {node: "node-3", hints: zoneNode("zone-b", "node-3")},
				{node: "node-4", hints: zoneNode("zone-a", "node-4")}},
			want: []int{0, 2}},
		// The topology-mode annotation makes the controller write zone
		// hints without trafficDistribution; kube-proxy follows hints alone.
		{name: "hints without trafficDistribution",
			eps: [3]semEP{{hints: zone("zone-b")}, {hints: zone("zone-a")}, {hints: zone("zone-b")}}, want: []int{1}},
	}
	manifests := map[string]string{"node.yaml": semNode}
	s := newScenario(t, 3, manifests)
	for i, tt := range tests {
		svc := semSvc{name: fmt.Sprintf("choice-%d", i), clusterIPs: []string{fmt.Sprintf("10.96.1.%d", i+1)}, spec: tt.spec}
		for j, e := range tt.eps {
			e.addr = s.topo.Pods[j].Addr.String()
			svc.v4 = append(svc.v4, e)
		}
		manifests[svc.name+".yaml"] = svc.yaml()
	}
	s.change(func() {
		for name, content := range manifests {
			s.write(name, content)
		}
	})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []string
			for _, j := range tt.want {
				want = append(want, s.topo.Pods[j].Name)
			}
			sub := *s
			sub.t = t
			addr := netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("10.96.1.%d", i+1)), 80)
			sub.semWantAnswers(tt.name, s.topo.InClusterClient.NS, netip.Addr{}, addr, 40, want...)
		})
	}
}

func TestSemServiceCIDR(t *testing.T) {
	s := newScenario(t, 1, nil, "--service-cidr", "10.96.0.0/16,fd00:96::/112")
	web := semSvc{name: "web", clusterIPs: []string{"10.96.0.10", "fd00:96::10"},
		v4: semEPs(s.topo.Pods[0].Addr), v6: []semEP{{addr: s.topo.Pods[0].Addr6.String()}}}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	pod := s.topo.Pods[0].Name
	for _, from := range []*netns.NS{s.topo.Client, s.topo.InClusterClient.NS} {
		s.semWantAnswers("live ClusterIP", from, netip.Addr{}, webVIP, 3, pod)
		s.semWantDropped("unallocated address of the service CIDR", from, netip.Addr{}, netip.MustParseAddrPort("10.96.0.99:80"))
		s.semWantRefused("unused port of a live ClusterIP", from, netip.MustParseAddrPort("10.96.0.10:81"))
		s.semWantDropped("unallocated IPv6 address of the service CIDR", from, netip.Addr{}, netip.MustParseAddrPort("[fd00:96::99]:80"))
		s.semWantRefused("unused port of a live IPv6 ClusterIP", from, netip.MustParseAddrPort("[fd00:96::10]:81"))
	}
	// Outside the service CIDRs nothing is dropped: the node answers that it
	// has no route.
	_, err := s.semAsk(s.topo.Client, netip.Addr{}, netip.MustParseAddrPort("10.97.0.99:80"))
	if err == nil || netns.IsTimeout(err) {
		t.Errorf("10.97.0.99 (outside the service CIDR): %v, want an unreachable error", err)
	}
}

func TestSemIPv6(t *testing.T) {
	s := newScenario(t, 2, nil)
	vip6 := netip.MustParseAddrPort("[fd00:96::10]:80")
	np6 := netip.AddrPortFrom(netns.NodeAddr6, 30080)
	web := semSvc{name: "web", typ: "NodePort", clusterIPs: []string{"fd00:96::10"}, nodePort: 30080,
		spec: "  ipFamilies: [IPv6]\n", v6: []semEP{{addr: s.topo.Pods[0].Addr6.String()}, {addr: s.topo.Pods[1].Addr6.String()}}}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	both := []string{s.topo.Pods[0].Name, s.topo.Pods[1].Name}
	s.semWantAnswers("client to the IPv6 ClusterIP", s.topo.Client, netip.Addr{}, vip6, 40, both...)
	s.semWantAnswers("client to the IPv6 NodePort", s.topo.Client, netip.Addr{}, np6, 40, both...)
	s.semWantAnswers("in-cluster client to the IPv6 ClusterIP", s.topo.InClusterClient.NS, netip.Addr{}, vip6, 40, both...)
	for _, addr := range []netip.AddrPort{vip6, np6} {
		if got := s.semPeer(s.topo.Client, netip.Addr{}, addr); got != netns.BridgeAddr6 {
			t.Errorf("through %s the pod saw the outside client as %s, want it masqueraded to %s", addr, got, netns.BridgeAddr6)
		}
	}
	if got, want := s.semPeer(s.topo.InClusterClient.NS, netip.Addr{}, vip6), s.topo.InClusterClient.Addr6; got != want {
		t.Errorf("the pod saw the in-cluster client as %s, want its own address %s", got, want)
	}
	// A single-stack IPv6 service has no IPv4 NodePort.
	if name, err := s.semAsk(s.topo.Client, netip.Addr{}, nodePort); err == nil {
		t.Errorf("IPv4 NodePort of an IPv6-only service answered %q", name)
	}
}

func TestSemDualStack(t *testing.T) {
	s := newScenario(t, 2, nil)
	p0, p1 := s.topo.Pods[0], s.topo.Pods[1]
	web := semSvc{name: "web", typ: "NodePort", clusterIPs: []string{"10.96.0.10", "fd00:96::10"}, nodePort: 30080,
		spec: "  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n",
		v4:   semEPs(p0.Addr, p1.Addr), v6: []semEP{{addr: p0.Addr6.String()}, {addr: p1.Addr6.String()}}}
	s.change(func() { s.write("web.yaml", web.yaml()) })
	both := []string{p0.Name, p1.Name}
	for _, addr := range []netip.AddrPort{webVIP, netip.MustParseAddrPort("[fd00:96::10]:80"), nodePort, netip.AddrPortFrom(netns.NodeAddr6, 30080)} {
		s.semWantAnswers("client", s.topo.Client, netip.Addr{}, addr, 40, both...)
		s.semWantAnswers("in-cluster client", s.topo.InClusterClient.NS, netip.Addr{}, addr, 40, both...)
	}
}

func TestSemLocalhostNodePorts(t *testing.T) {
	loopback := netip.MustParseAddrPort("127.0.0.1:30080")
	for _, enabled := range []bool{true, false} {
		t.Run(fmt.Sprintf("--localhost-nodeports=%v", enabled), func(t *testing.T) {
			s := newScenario(t, 1, webManifests("10.244.1.10"), fmt.Sprintf("--localhost-nodeports=%v", enabled))
			if !enabled {
				s.semWantRefused("127.0.0.1 without the flag (nothing listens there)", s.topo.Node, loopback)
				return
			}
			s.semWantAnswers("the node to 127.0.0.1", s.topo.Node, netip.Addr{}, loopback, 5, s.topo.Pods[0].Name)
			// IPv4 only, like kube-proxy.
			s.semWantRefused("::1 (nothing listens there)", s.topo.Node, netip.MustParseAddrPort("[::1]:30080"))
		})
	}
}

// TestSemHairpinThisNodeOnly: with the Node known, a pod that is its own
// service's endpoint still reaches itself through the ClusterIP (which only
// the hairpin masquerade makes work), and the hairpin set holds the pairs of
// this node's endpoints only: none for an endpoint on another node.
func TestSemHairpinThisNodeOnly(t *testing.T) {
	s := newScenario(t, 1, map[string]string{"node.yaml": semNode})
	pod := s.topo.Pods[0]
	web := semSvc{name: "web", clusterIPs: []string{"10.96.0.10"}, v4: semEPs(pod.Addr)}
	other := semSvc{name: "other", clusterIPs: []string{"10.96.0.11"}, v4: []semEP{{addr: "10.244.2.10", node: "node-2"}}}
	s.change(func() { s.write("web.yaml", web.yaml()); s.write("other.yaml", other.yaml()) })
	s.semWantAnswers("the endpoint asking its own service", pod.NS, netip.Addr{}, webVIP, 5, pod.Name)
	table := s.kernelTable()
	if own := pod.Addr.String() + " . " + pod.Addr.String(); !strings.Contains(table, own) {
		t.Errorf("no hairpin pair %s for this node's endpoint:\n%s", own, table)
	}
	if strings.Contains(table, "10.244.2.10 . 10.244.2.10") {
		t.Errorf("a hairpin pair for node-2's endpoint:\n%s", table)
	}
}
