package proxier

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// TestPatchedMatchesCompiled: a service's slices change at random through
// the tracker, and one proxier takes the tracker's endpoint deltas (which
// patch its wide ports) while another is handed the same changes without
// them (and compiles). After every step both kernels hold the same tables,
// so the patch picks the slots nextSlots picks, and those are the tables
// Compile builds from the slots applied. Seeds vary the service (node port,
// traffic policies, affinity, which patches do not take), the node (known or
// not), the thresholds, so lists cross the wide maps' size, and whether
// topology hints come, after the patches started, to narrow the choice.
func TestPatchedMatchesCompiled(t *testing.T) {
	defer func(v, w int) { keptFromEndpoints, wideFrom = v, w }(keptFromEndpoints, wideFrom)
	patched := 0
	for seed := range uint64(24) {
		keptFromEndpoints = []int{0, 20}[seed%2]
		wideFrom = []int{64, 8}[seed/2%2]
		r := rand.New(rand.NewPCG(seed, 7))
		tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
		var node *v1.Node
		if seed%3 != 0 {
			node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}},
				Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.1.1"}}}}
		}
		sls := make([]*discoveryv1.EndpointSlice, 4)
		for i := range sls {
			sls[i] = patchSlice(i)
			for range r.IntN([]int{30, 30, 8, 30}[seed%4]) {
				sls[i].Endpoints = append(sls[i].Endpoints, patchEndpoint(r, i, false))
			}
		}
		tr.ReplaceAll([]*v1.Service{patchService(seed)}, sls, node)
		kernels := [2]*modelKernel{{t: t, tables: map[m.Family]*m.Ruleset{}}, {t: t, tables: map[m.Family]*m.Ruleset{}}}
		var ps [2]*Proxier
		var hcs [3]*HealthChecks // the proxiers', and one updated from snapshots
		for i := range hcs {
			hcs[i] = NewHealthChecks(zap.NewNop(), NewHealth(60e9), HealthCheckOptions{Listen: idleListen})
			defer hcs[i].Close()
		}
		for i := range ps {
			ps[i] = New(Options{Configs: incrementalConfigs, Kernel: kernels[i], HealthChecks: hcs[i]})
		}
		tr.TakeChanges()
		snap := tr.Snapshot()
		for _, p := range ps {
			if err := p.Sync(context.Background(), snap, true); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 60 {
			// Now and then two slices change before a hand-over: the
			// second change is merged, not spliced.
			for range 1 + r.IntN(8)/7 {
				i := r.IntN(len(sls))
				sls[i] = mutateSlice(r, sls[i], i, seed%4 == 2 && step >= 20)
				tr.SetSlice(sls[i])
			}
			ch := tr.TakeChanges()
			if err := ps[0].SyncChanges(context.Background(), ch); err != nil {
				t.Fatal(err)
			}
			ch.Deltas = nil
			if err := ps[1].SyncChanges(context.Background(), ch); err != nil {
				t.Fatal(err)
			}
			snap := tr.Snapshot()
			hcs[2].Update(snap)
			for i := range ps {
				if got, want := serving(hcs[i]), serving(hcs[2]); !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: proxier %d's health check servers %v, want %v", seed, step, i, got, want)
				}
			}
			for _, cfg := range incrementalConfigs {
				var wantNL noLocalCounts
				for i := range snap.Services {
					wantNL.set(snap.Services[i].Name, noLocalOf(&snap.Services[i], &snap.Node, cfg))
				}
				for i := range ps {
					if got := ps[i].noLocal[cfg.Family]; got.internal != wantNL.internal || got.external != wantNL.external {
						t.Fatalf("seed %d step %d %s: proxier %d counts %+v ports without local endpoints, want %+v", seed, step, cfg.Family, i, *got, wantNL)
					}
				}
				got, compiled := normalRender(kernels[0].tables[cfg.Family]), normalRender(kernels[1].tables[cfg.Family])
				if diff := gocmp.Diff(compiled, got); diff != "" {
					t.Fatalf("seed %d step %d %s: patched tables differ from compiled ones (-compiled +patched):\n%s", seed, step, cfg.Family, diff)
				}
				want := normalRender(compileWithSlots(snap, cfg, ps[0].applied[cfg.Family].slots))
				if diff := gocmp.Diff(want, got); diff != "" {
					t.Fatalf("seed %d step %d %s: tables differ from Compile (-compiled +patched):\n%s", seed, step, cfg.Family, diff)
				}
				for _, kept := range ps[0].applied[cfg.Family].wide {
					if kept.w != nil && kept.sp == ps[0].ports[kept.sp.Name] {
						patched++
					}
				}
			}
		}
	}
	// Most steps of most seeds patch; this fails only when none does.
	t.Logf("%d patched ports", patched)
	if patched < 200 {
		t.Errorf("%d patched ports over all steps; the patch path is not taken", patched)
	}
}

func patchService(seed uint64) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "wide"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}, {Name: "metrics", Port: 9090, Protocol: v1.ProtocolTCP}}},
	}
	if seed%4 >= 2 {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort = 30080, 30090
		if seed%8 >= 6 {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 31000
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.168.50.10"}}
		}
	}
	if seed%5 == 1 {
		local := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &local
	}
	if seed%7 == 3 {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	return s
}

func patchSlice(i int) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("wide-%d", i), Labels: map[string]string{discoveryv1.LabelServiceName: "wide"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](8080), Protocol: ptrTo(v1.ProtocolTCP)},
			{Name: ptrTo("metrics"), Port: ptrTo[int32](9090), Protocol: ptrTo(v1.ProtocolTCP)}},
	}
}

func ptrTo[T any](v T) *T { return &v }

// patchEndpoint is a random endpoint of slice i: mostly ready, on one of two
// nodes or none, with zone hints (hints); its address may be in another
// slice too.
func patchEndpoint(r *rand.Rand, i int, hints bool) discoveryv1.Endpoint {
	ready := r.IntN(10) < 8
	serving := ready || r.IntN(2) == 0
	terminating := !ready && r.IntN(3) > 0
	e := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i, 1+r.IntN(60))},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
	if n := []string{"node-1", "node-2", ""}[r.IntN(3)]; n != "" {
		e.NodeName = &n
	}
	if r.IntN(80) == 0 {
		e.Addresses[0] = fmt.Sprintf("10.244.9.%d", 1+r.IntN(10))
	}
	// With hints, most endpoints have them, so that they narrow the
	// choice now and then.
	if hints && r.IntN(15) > 0 {
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: []string{"zone-a", "zone-b"}[r.IntN(2)]}}}
	}
	return e
}

// mutateSlice returns a new version of s: an endpoint replaced, added,
// removed, or with other conditions or node.
func mutateSlice(r *rand.Rand, s *discoveryv1.EndpointSlice, si int, hints bool) *discoveryv1.EndpointSlice {
	n := s.DeepCopy()
	n.ResourceVersion = fmt.Sprint(r.Uint64())
	i := 0
	if len(n.Endpoints) > 0 {
		i = r.IntN(len(n.Endpoints))
	}
	switch op := r.IntN(10); {
	case len(n.Endpoints) == 0 || op < 2:
		n.Endpoints = append(n.Endpoints, patchEndpoint(r, si, hints))
	case op < 6:
		n.Endpoints[i] = patchEndpoint(r, si, hints)
	case op < 8:
		n.Endpoints = slices.Delete(n.Endpoints, i, i+1)
	default:
		e := patchEndpoint(r, si, hints)
		e.Addresses = n.Endpoints[i].Addresses
		n.Endpoints[i] = e
	}
	return n
}

// TestPlanSlotsIsNextSlots: a slot table patched by random deltas (several
// endpoints out and in at once, shrinking and growing) holds the order
// nextSlots gives the new list after the old order.
func TestPlanSlotsIsNextSlots(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	ep := func(i int) k8s.Endpoint {
		return k8s.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Port: 80}
	}
	var cur []k8s.Endpoint // sorted
	for i := range 40 {
		cur = append(cur, ep(2*i))
	}
	prev := slotList{eps: cur}
	tab, rebuilt := newSlotTable(prev), 0
	for step := range 300 {
		in := map[int]bool{}
		var next []k8s.Endpoint
		for _, e := range cur {
			if r.IntN(6) > 0 {
				next = append(next, e)
				in[int(e.Addr.As4()[2])<<8|int(e.Addr.As4()[3])] = true
			}
		}
		var out, added []netip.AddrPort
		for range r.IntN(8) {
			if i := r.IntN(200); !in[i] {
				in[i] = true
				next = append(next, ep(i))
			}
		}
		slices.SortFunc(next, func(a, b k8s.Endpoint) int { return addrPort(&a).Compare(addrPort(&b)) })
		for _, e := range cur {
			if !slices.ContainsFunc(next, func(n k8s.Endpoint) bool { return n.Addr == e.Addr }) {
				out = append(out, addrPort(&e))
			}
		}
		for _, e := range next {
			if !slices.ContainsFunc(cur, func(c k8s.Endpoint) bool { return c.Addr == e.Addr }) {
				added = append(added, addrPort(&e))
			}
		}
		plan, ok := planSlots(tab, out, added)
		if !ok {
			t.Fatalf("step %d: no plan", step)
		}
		plan.apply()
		want := nextSlots(prev, next)
		got := slotList{tab: tab, n: len(tab.keys)}
		for i := range max(want.len(), got.len()) {
			if i >= want.len() || i >= got.len() || want.addrPort(i) != got.addrPort(i) {
				t.Fatalf("step %d slot %d: table and nextSlots differ (lengths %d, %d)", step, i, got.len(), want.len())
			}
		}
		if len(tab.bykey) != len(tab.keys) {
			t.Fatalf("step %d: %d slots by key for %d keys", step, len(tab.bykey), len(tab.keys))
		}
		for i, slot := range tab.bykey {
			if i > 0 && tab.keys[tab.bykey[i-1]].Compare(tab.keys[slot]) >= 0 {
				t.Fatalf("step %d: the slots by key are not sorted at %d", step, i)
			}
			if at, ok := tab.find(tab.keys[slot]); !ok || at != i {
				t.Fatalf("step %d: slot %d not found by its key", step, slot)
			}
		}
		prev, cur = want, next
		if step%50 == 49 && prev.perm != nil {
			// A table made from a compiled, permuted order, as a
			// first patch makes it.
			tab, rebuilt = newSlotTable(prev), rebuilt+1
		}
	}
	if rebuilt == 0 {
		t.Fatal("no table was made from a permuted order")
	}
}

// serving lists what h's servers report, by port.
func serving(h *HealthChecks) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for port, s := range h.servers {
		s.mu.Lock()
		out = append(out, fmt.Sprintf("%d %s/%s %d", port, s.namespace, s.name, s.localEndpoints))
		s.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// idleListen opens a listener that accepts nothing, for servers that are
// only counted.
func idleListen(string, netip.AddrPort) (net.Listener, error) {
	return &idleListener{done: make(chan struct{})}, nil
}

type idleListener struct {
	done chan struct{}
	once sync.Once
}

func (l *idleListener) Accept() (net.Conn, error) { <-l.done; return nil, net.ErrClosed }
func (l *idleListener) Close() error              { l.once.Do(func() { close(l.done) }); return nil }
func (l *idleListener) Addr() net.Addr            { return &net.TCPAddr{} }
