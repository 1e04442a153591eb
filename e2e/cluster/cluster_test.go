package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// binary is the nftproxy built once for the tier (empty when not root).
var binary string

func TestMain(m *testing.M) { os.Exit(e2e.RunTests(m, &binary)) }

// env is the cluster every subtest shares; each subtest has its own
// Kubernetes namespace, ClusterIPs and NodePorts, and deletes its objects.
type env struct {
	t   *testing.T
	c   *Cluster
	ctx context.Context
	ns  string
}

func TestCluster(t *testing.T) {
	if binary == "" {
		netns.Require(t) // skips in -short mode before probing
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	if testing.Short() {
		t.Skip("skipping: needs a real kube-apiserver, which -short leaves out")
	}
	if _, err := os.Stat(apiserver.DefaultBinDir() + "/kube-apiserver"); err != nil {
		t.Skipf("skipping: kube-apiserver not built (%v); build it with e2e/apiserver/build.sh or `make k8s-bins`", err)
	}
	// Namespaces of an earlier run that was killed (their names carry its pid).
	if gone, err := netns.CleanupStale("npk"); err != nil {
		t.Fatal(err)
	} else if len(gone) > 0 {
		t.Logf("removed %d namespaces of a killed run", len(gone))
	}
	start := time.Now()
	// Two zones for three nodes: PreferSameZone and PreferSameNode differ.
	c, err := Start(t.Context(), Options{Binary: binary, Zones: []string{"zone-a", "zone-a", "zone-b"}, Prefix: "npk"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.API.KeepLogs()
			t.Logf("kube-apiserver logs kept in %s\n%s", c.API.Dir, c.Logs())
		}
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	for _, p := range c.Topo.Pods() {
		if _, err := p.ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("cluster of %d nodes up in %s", len(c.Topo.Nodes), time.Since(start).Round(time.Millisecond))
	tests := []struct {
		name string
		run  func(*env)
	}{
		{"ClusterIPAndNodePortAcrossNodes", testAcrossNodes},
		{"ExternalTrafficPolicyLocal", testPolicyLocal},
		{"Topology", testTopology},
		{"RollingRestart", testRollingRestart},
		// Last: it deletes and recreates node-1.
		{"NodeDrain", testNodeDrain},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			e := &env{t: t, c: c, ctx: ctx, ns: fmt.Sprintf("e2e-%d", i)}
			e.namespace()
			tt.run(e)
			t.Logf("took %s", time.Since(start).Round(time.Millisecond))
		})
	}
}

// namespace creates the subtest's namespace and deletes its Services and
// EndpointSlices when it ends (no namespace controller runs, so the
// namespace itself stays).
func (e *env) namespace() {
	e.t.Helper()
	if _, err := e.c.Client.CoreV1().Namespaces().Create(e.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := apiserver.DeleteServicesAndSlices(ctx, e.c.Client, e.ns); err != nil {
			e.t.Error(err)
		}
	})
}

// service creates a TCP Service port 80 → 8080 on clusterIP; nodePort 0
// makes a ClusterIP service, otherwise a NodePort one (mods may change it).
func (e *env) service(name, clusterIP string, nodePort int32, mods ...func(*v1.Service)) *v1.Service {
	e.t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: nodePort}}},
	}
	if nodePort != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	for _, m := range mods {
		m(svc)
	}
	got, err := e.c.Client.CoreV1().Services(e.ns).Create(e.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create service %s: %v", name, err)
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		// No cloud controller: the test is the load balancer and writes its address.
		got.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: netns.LoadBalancerIP.String()}}
		if got, err = e.c.Client.CoreV1().Services(e.ns).UpdateStatus(e.ctx, got, metav1.UpdateOptions{}); err != nil {
			e.t.Fatalf("set load balancer status of %s: %v", name, err)
		}
	}
	return got
}

func loadBalancer(local bool) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		if local {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
	}
}

// endpoint is one pod in a slice, with optional topology hints.
type endpoint struct {
	pod       *netns.Pod
	node      *netns.ClusterNode
	zoneHints []string
	nodeHints []string
}

// podsOf returns the endpoints of every pod on the given nodes.
func (e *env) podsOf(nodes ...string) []endpoint {
	var eps []endpoint
	for _, name := range nodes {
		n := e.c.Topo.Node(name)
		for _, p := range n.Pods {
			eps = append(eps, endpoint{pod: p, node: n})
		}
	}
	return eps
}

func names(eps []endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.pod.Name)
	}
	slices.Sort(out)
	return out
}

// slice creates or replaces the service's one EndpointSlice with ready
// endpoints, each with its node, zone and hints.
func (e *env) slice(service string, eps []endpoint) {
	e.t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-1", Namespace: e.ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "e2e-cluster"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, ep := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{ep.pod.Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(ep.node.Name), Zone: ptr.To(e.c.Zone(ep.node))}
		if len(ep.zoneHints)+len(ep.nodeHints) > 0 {
			d.Hints = &discoveryv1.EndpointHints{}
			for _, z := range ep.zoneHints {
				d.Hints.ForZones = append(d.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range ep.nodeHints {
				d.Hints.ForNodes = append(d.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	client := e.c.Client.DiscoveryV1().EndpointSlices(e.ns)
	old, err := client.Get(e.ctx, es.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = client.Create(e.ctx, es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = client.Update(e.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		e.t.Fatalf("write slice of %s: %v", service, err)
	}
}

// answers asks addr n times from ns and counts the answers by name; an
// error ends the count.
func (e *env) answers(from *netns.NS, addr netip.AddrPort, n int) (map[string]int, error) {
	got := map[string]int{}
	for range n {
		name, err := from.AskTCP(e.ctx, addr)
		if err != nil {
			return got, fmt.Errorf("ask %s from %s: %w", addr, from, err)
		}
		got[name]++
	}
	return got, nil
}

// answeredBy asks addr from ns several times per wanted name and reports
// unless exactly the wanted pods answered.
func (e *env) answeredBy(from *netns.NS, addr netip.AddrPort, want []string) error {
	got, err := e.answers(from, addr, 8*len(want))
	if err != nil {
		return err
	}
	if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, want) {
		return fmt.Errorf("%s from %s answered by %v, want %v", addr, from, got, want)
	}
	return nil
}

// peer connects from ns to addr and returns the source address the
// answering pod saw.
func (e *env) peer(from *netns.NS, addr netip.AddrPort) (string, netip.Addr, error) {
	s, err := from.ConnectTCP(e.ctx, netip.AddrPort{}, addr)
	if err != nil {
		return "", netip.Addr{}, err
	}
	defer s.Close()
	p, err := s.Peer(e.ctx)
	return s.Name, p.Addr(), err
}

// dropped reports unless a connection to addr from ns gets no answer at
// all (neither a pod's nor a refusal).
func (e *env) dropped(from *netns.NS, addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(e.ctx, 700*time.Millisecond)
	defer cancel()
	name, err := from.AskTCP(ctx, addr)
	switch {
	case err == nil:
		return fmt.Errorf("%s answered by %s, want a drop", addr, name)
	case !netns.IsTimeout(err):
		return fmt.Errorf("ask %s: %v, want a timeout (dropped)", addr, err)
	}
	return nil
}

// eventually polls f for up to 20 s and returns how long it took.
func (e *env) eventually(what string, f func() error) time.Duration {
	e.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("%s: not after %s: %v", what, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (e *env) node(i int) *netns.ClusterNode { return e.c.Topo.Nodes[i-1] }

func nodePortOf(n *netns.ClusterNode, port int32) netip.AddrPort {
	return netip.AddrPortFrom(n.Addr, uint16(port))
}

func testAcrossNodes(e *env) {
	t := e.t
	vip := netip.MustParseAddrPort("10.96.30.10:80")
	const np = 30300
	e.service("web", vip.Addr().String(), np)
	remote := e.podsOf("node-2", "node-3")
	e.slice("web", remote)
	client := e.node(1).Pods[0]
	e.eventually("service on every node", func() error {
		return errors.Join(e.answeredBy(client.NS, vip, names(remote)),
			e.answeredBy(e.c.Topo.Client, nodePortOf(e.node(1), np), names(remote)))
	})
	// Spread: each of the four remote pods gets a fair share.
	got, err := e.answers(client.NS, vip, 200)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names(remote) {
		if got[n] < 20 {
			t.Errorf("%s answered %d of 200 ClusterIP connections from %s, want at least 20: %v", n, got[n], client.Name, got)
		}
	}
	t.Logf("ClusterIP from %s on node-1: %v", client.Name, got)
	// The pod's own address reaches the remote pod: no masquerade.
	for range 6 {
		name, src, err := e.peer(client.NS, vip)
		if err != nil {
			t.Fatal(err)
		}
		if src != client.Addr {
			t.Errorf("ClusterIP from %s answered by %s seen from %s, want the pod's own address", client.Name, name, src)
		}
	}
	// From outside through node-1's NodePort: masqueraded to node-1's address,
	// so the remote pods' answers come back through node-1.
	for range 6 {
		name, src, err := e.peer(e.c.Topo.Client, nodePortOf(e.node(1), np))
		if err != nil {
			t.Fatal(err)
		}
		if src != e.node(1).Addr {
			t.Errorf("NodePort of node-1 answered by %s seen from %s, want node-1's %s (masqueraded)", name, src, e.node(1).Addr)
		}
	}
}

// hcGet fetches a node's healthCheckNodePort from the load-balancer
// namespace and decodes kube-proxy's body.
func (e *env) hcGet(n *netns.ClusterNode, port int32) (int, int, error) {
	code, body, err := e.c.Topo.LoadBalancer.Get(e.ctx, fmt.Sprintf("http://%s/", nodePortOf(n, port)))
	if err != nil {
		return 0, 0, err
	}
	var b struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return code, 0, fmt.Errorf("decode %q: %w", body, err)
	}
	return code, b.LocalEndpoints, nil
}

// checkHealthCheckPort reports unless the nodes in local answer 200 with
// their count of local endpoints and every other node 503 with none.
func (e *env) checkHealthCheckPort(port int32, local map[string]int) error {
	for _, n := range e.c.Topo.Nodes {
		code, count, err := e.hcGet(n, port)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		want, wantCode := local[n.Name], http.StatusOK
		if want == 0 {
			wantCode = http.StatusServiceUnavailable
		}
		if code != wantCode || count != want {
			return fmt.Errorf("health check of %s: %d with %d local endpoints, want %d with %d", n.Name, code, count, wantCode, want)
		}
	}
	return nil
}

// backends are the nodes behind a load balancer for NodePort np, checked
// at health (a port: the healthCheckNodePort; 0: nftproxy's /healthz).
func (e *env) backends(np int32, health int32) []Backend {
	var out []Backend
	for _, n := range e.c.Topo.Nodes {
		url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.Addr, HealthzPort))
		if health != 0 {
			url = fmt.Sprintf("http://%s/", nodePortOf(n, health))
		}
		out = append(out, Backend{Node: n.Name, Addr: nodePortOf(n, np), Health: url})
	}
	return out
}

// loadBalancer starts a load balancer on port in front of every node's
// NodePort np, checked at health as backends says. The caller closes it.
func (e *env) loadBalancer(port uint16, np, health int32) *LoadBalancer {
	e.t.Helper()
	lb, err := e.c.StartLoadBalancer(port, e.backends(np, health), 100*time.Millisecond)
	if err != nil {
		e.t.Fatal(err)
	}
	return lb
}

// allHealthy waits until lb finds every node healthy.
func (e *env) allHealthy(lb *LoadBalancer) {
	e.t.Helper()
	e.eventually("every node healthy behind the load balancer", func() error {
		if h := lb.Healthy(); len(h) != len(e.c.Topo.Nodes) {
			return fmt.Errorf("healthy %v", h)
		}
		return nil
	})
}

func testPolicyLocal(e *env) {
	t := e.t
	vip := netip.MustParseAddrPort("10.96.31.10:80")
	const np = 30310
	svc := e.service("local", vip.Addr().String(), np, loadBalancer(true))
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the API server allocated no healthCheckNodePort")
	}
	on2 := e.podsOf("node-2")
	e.slice("local", on2)
	client := e.c.Topo.Client
	e.eventually("NodePort of node-2", func() error { return e.answeredBy(client, nodePortOf(e.node(2), np), names(on2)) })
	// Only local endpoints, and the client's own address reaches them.
	for range 6 {
		name, src, err := e.peer(client, nodePortOf(e.node(2), np))
		if err != nil {
			t.Fatal(err)
		}
		if src != netns.ClusterClientAddr {
			t.Errorf("NodePort of node-2 (Local) answered by %s seen from %s, want the client's %s", name, src, netns.ClusterClientAddr)
		}
	}
	// Nodes without a local endpoint drop.
	for _, i := range []int{1, 3} {
		if err := e.dropped(client, nodePortOf(e.node(i), np)); err != nil {
			t.Errorf("node-%d without a local endpoint: %v", i, err)
		}
	}
	e.eventually("health check port", func() error { return e.checkHealthCheckPort(hc, map[string]int{"node-2": 2}) })

	lb := e.loadBalancer(80, np, hc)
	defer lb.Close()
	through := func(want []endpoint) error {
		got, err := e.answers(client, lb.Addr(), 30)
		if err != nil {
			return fmt.Errorf("%v (%s)", err, lb)
		}
		if answered := slices.Sorted(maps.Keys(got)); !slices.Equal(answered, names(want)) {
			return fmt.Errorf("through the load balancer: %v, want %v (%s)", got, names(want), lb)
		}
		return nil
	}
	e.eventually("load balancer on node-2 only", func() error {
		if h := lb.Healthy(); !slices.Equal(h, []string{"node-2"}) {
			return fmt.Errorf("healthy %v", h)
		}
		return nil
	})
	before, _ := lb.Sent()
	if err := through(on2); err != nil {
		t.Fatal(err)
	}
	after, failed := lb.Sent()
	if after["node-2"]-before["node-2"] != 30 || failed != 0 {
		t.Errorf("load balancer sent %v (before %v), %d failed; want 30 more to node-2", after, before, failed)
	}

	// The endpoints move to node-3: so do the health checks and the traffic.
	on3 := e.podsOf("node-3")
	e.slice("local", on3)
	took := e.eventually("endpoints moved to node-3", func() error {
		if h := lb.Healthy(); !slices.Equal(h, []string{"node-3"}) {
			return fmt.Errorf("healthy %v", h)
		}
		return e.checkHealthCheckPort(hc, map[string]int{"node-3": 2})
	})
	t.Logf("endpoints moved: the load balancer followed after %s", took.Round(time.Millisecond))
	if err := through(on3); err != nil {
		t.Fatal(err)
	}
	if err := e.dropped(client, nodePortOf(e.node(2), np)); err != nil {
		t.Errorf("node-2 after its endpoints left: %v", err)
	}
}

func testTopology(e *env) {
	t := e.t
	// node-1 and node-2 are in zone-a, node-3 in zone-b.
	all := e.podsOf("node-1", "node-2", "node-3")
	for _, tt := range []struct {
		name, dist string
		vip        netip.AddrPort
		hints      func(ep endpoint) endpoint
		// want is who answers the pods of each node.
		want map[string][]string
	}{
		{"PreferSameZone", v1.ServiceTrafficDistributionPreferSameZone, netip.MustParseAddrPort("10.96.33.10:80"),
			func(ep endpoint) endpoint { ep.zoneHints = []string{e.c.Zone(ep.node)}; return ep },
			map[string][]string{"node-1": names(e.podsOf("node-1", "node-2")), "node-2": names(e.podsOf("node-1", "node-2")), "node-3": names(e.podsOf("node-3"))}},
		{"PreferSameNode", v1.ServiceTrafficDistributionPreferSameNode, netip.MustParseAddrPort("10.96.33.11:80"),
			func(ep endpoint) endpoint {
				ep.zoneHints, ep.nodeHints = []string{e.c.Zone(ep.node)}, []string{ep.node.Name}
				return ep
			},
			map[string][]string{"node-1": names(e.podsOf("node-1")), "node-2": names(e.podsOf("node-2")), "node-3": names(e.podsOf("node-3"))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := strings.ToLower(tt.name)
			e.service(name, tt.vip.Addr().String(), 0, func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To(tt.dist) })
			var eps []endpoint
			for _, ep := range all {
				eps = append(eps, tt.hints(ep))
			}
			e.slice(name, eps)
			for _, n := range e.c.Topo.Nodes {
				for _, p := range n.Pods {
					e.eventually(p.Name, func() error { return e.answeredBy(p.NS, tt.vip, tt.want[n.Name]) })
				}
			}
		})
	}
}

// traffic keeps clients connecting until stopped, and counts.
type traffic struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       chan struct{}
	wg         sync.WaitGroup
}

func (tr *traffic) fail(what string, err error) {
	tr.failed.Add(1)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.errs) < 10 {
		tr.errs = append(tr.errs, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), what, err))
	}
}

// connect opens a new connection to addr from ns every 20 ms.
func (tr *traffic) connect(e *env, what string, from *netns.NS, addr func(i int) netip.AddrPort) {
	tr.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			a := addr(i)
			if _, err := from.AskTCP(e.ctx, a); err != nil {
				tr.fail(fmt.Sprintf("%s %s", what, a), err)
				continue
			}
			tr.ok.Add(1)
		}
	})
}

// hold keeps one connection open and echoes on it every 100 ms.
func (tr *traffic) hold(e *env, what string, from *netns.NS, addr netip.AddrPort) error {
	s, err := from.ConnectTCP(e.ctx, netip.AddrPort{}, addr)
	if err != nil {
		return err
	}
	tr.wg.Go(func() {
		defer s.Close()
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			line := "ping " + strconv.Itoa(i)
			if got, err := s.Echo(e.ctx, line); err != nil || got != line {
				tr.fail("long-lived "+what+" to "+s.Name, fmt.Errorf("echo %q: %q, %v", line, got, err))
				return
			}
			tr.ok.Add(1)
		}
	})
	return nil
}

func (tr *traffic) finish() (ok, failed int64, errs []string) {
	close(tr.stop)
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.ok.Load(), tr.failed.Load(), tr.errs
}

func testRollingRestart(e *env) {
	t := e.t
	vip := netip.MustParseAddrPort("10.96.32.10:80")
	const np = 30320
	e.service("web", vip.Addr().String(), np, loadBalancer(false))
	all := e.podsOf("node-1", "node-2", "node-3")
	e.slice("web", all)
	podClient := e.node(1).Pods[1]
	client := e.c.Topo.Client
	e.eventually("service", func() error {
		return errors.Join(e.answeredBy(podClient.NS, vip, names(all)), e.answeredBy(client, nodePortOf(e.node(3), np), names(all)))
	})
	lb := e.loadBalancer(81, np, 0)
	defer lb.Close()
	e.allHealthy(lb)

	tr := &traffic{stop: make(chan struct{})}
	type flow struct {
		what string
		from *netns.NS
		addr netip.AddrPort
	}
	// Long-lived: the ClusterIP from a pod of every node, a NodePort of
	// every node, and the load balancer.
	held := []flow{{"load balancer", client, lb.Addr()}}
	for _, n := range e.c.Topo.Nodes {
		held = append(held, flow{"ClusterIP from " + n.Pods[1].Name, n.Pods[1].NS, vip}, flow{"NodePort of " + n.Name, client, nodePortOf(n, np)})
	}
	for _, h := range held {
		if err := tr.hold(e, h.what, h.from, h.addr); err != nil {
			t.Fatal(err)
		}
	}
	// New connections: the ClusterIP from a pod of every node, every
	// node's NodePort in turn, the load balancer.
	for _, n := range e.c.Topo.Nodes {
		tr.connect(e, "ClusterIP from "+n.Pods[0].Name, n.Pods[0].NS, func(int) netip.AddrPort { return vip })
	}
	tr.connect(e, "NodePort", client, func(i int) netip.AddrPort { return nodePortOf(e.c.Topo.Nodes[i%len(e.c.Topo.Nodes)], np) })
	tr.connect(e, "load balancer", client, func(int) netip.AddrPort { return lb.Addr() })
	for _, n := range e.c.Topo.Nodes {
		start := time.Now()
		if err := e.c.RestartDaemon(e.ctx, n.Name); err != nil {
			t.Fatal(err)
		}
		t.Logf("nftproxy on %s restarted and synced in %s", n.Name, time.Since(start).Round(time.Millisecond))
		time.Sleep(300 * time.Millisecond)
	}
	ok, failed, errs := tr.finish()
	t.Logf("rolling restart of %d nodes: %d connections and echoes succeeded, %d failed; %s", len(e.c.Topo.Nodes), ok, failed, lb)
	if failed != 0 || ok < 200 {
		t.Errorf("%d failed (want none), %d succeeded; first failures:\n%s", failed, ok, strings.Join(errs, "\n"))
	}
}

func testNodeDrain(e *env) {
	t := e.t
	vip := netip.MustParseAddrPort("10.96.34.10:80")
	const np = 30340
	e.service("web", vip.Addr().String(), np, loadBalancer(false))
	// The endpoints are elsewhere: draining node-1 is about node-1's proxy.
	remote := e.podsOf("node-2", "node-3")
	e.slice("web", remote)
	client := e.c.Topo.Client
	e.eventually("service", func() error { return e.answeredBy(client, nodePortOf(e.node(1), np), names(remote)) })
	lb := e.loadBalancer(82, np, 0)
	defer lb.Close()
	e.allHealthy(lb)
	tr := &traffic{stop: make(chan struct{})}
	if err := tr.hold(e, "NodePort of node-1", client, nodePortOf(e.node(1), np)); err != nil {
		t.Fatal(err)
	}
	tr.connect(e, "load balancer", client, func(int) netip.AddrPort { return lb.Addr() })
	time.Sleep(300 * time.Millisecond)

	// Mark node-1 for deletion; a finalizer holds it, as a drain would.
	nodes := e.c.Client.CoreV1().Nodes()
	const finalizer = "e2e.nftproxy.io/drain"
	if _, err := nodes.Patch(e.ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+finalizer+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	recreate := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := nodes.Patch(ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		for {
			_, err := nodes.Get(ctx, "node-1", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("node-1 not deleted: %w", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
		return e.c.CreateNode(ctx, e.node(1))
	}
	recreated := false
	t.Cleanup(func() {
		if !recreated {
			if err := recreate(); err != nil {
				t.Errorf("recreate node-1: %v", err)
			}
		}
	})
	syncs := e.c.Daemon("node-1").Syncs()
	marked := time.Now()
	if err := nodes.Delete(e.ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	healthz := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(e.node(1).Addr, HealthzPort))
	var drained time.Duration
	e.eventually("node-1's /healthz 503", func() error {
		code, body, err := e.c.Topo.LoadBalancer.Get(e.ctx, healthz)
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable {
			return fmt.Errorf("/healthz %d %s", code, body)
		}
		drained = time.Since(marked)
		syncs = e.c.Daemon("node-1").Syncs() - syncs
		return nil
	})
	e.eventually("load balancer drops node-1", func() error {
		if h := lb.Healthy(); slices.Contains(h, "node-1") {
			return fmt.Errorf("healthy %v", h)
		}
		return nil
	})
	left := time.Since(marked)
	sentAt, _ := lb.Sent()
	time.Sleep(time.Second)
	sent, _ := lb.Sent()
	ok, failed, errs := tr.finish()
	// The 503 comes with the sync of the Node change (its eligibility is
	// taken before the rules are applied, so 0 or 1 syncs are logged by then).
	t.Logf("node-1 marked for deletion: /healthz 503 after %s (syncs logged since: %d), out of the load balancer after %s; %d connections ok, %d failed; %s",
		drained.Round(time.Millisecond), syncs, left.Round(time.Millisecond), ok, failed, lb)
	if syncs > 1 {
		t.Errorf("/healthz turned 503 only after %d syncs, want it with the first after the deletion", syncs)
	}
	if failed != 0 {
		t.Errorf("%d failed connections while draining:\n%s", failed, strings.Join(errs, "\n"))
	}
	if sent["node-1"] != sentAt["node-1"] {
		t.Errorf("the load balancer sent %d connections to node-1 after dropping it", sent["node-1"]-sentAt["node-1"])
	}
	if sent["node-2"] == sentAt["node-2"] || sent["node-3"] == sentAt["node-3"] {
		t.Errorf("the other nodes got no new connections: before %v, after %v", sentAt, sent)
	}
	// The rules stay: node-1 still forwards what reaches it.
	if err := e.answeredBy(client, nodePortOf(e.node(1), np), names(remote)); err != nil {
		t.Errorf("a draining node's rules: %v", err)
	}

	recreated = true
	if err := recreate(); err != nil {
		t.Fatal(err)
	}
	e.eventually("node-1 back behind the load balancer", func() error {
		if h := lb.Healthy(); len(h) != 3 {
			return fmt.Errorf("healthy %v", h)
		}
		return nil
	})
}
