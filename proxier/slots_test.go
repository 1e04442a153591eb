package proxier

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// eps makes endpoints 10.244.0.<n>:8080, in the order given.
func eps(ns ...int) []k8s.Endpoint {
	out := make([]k8s.Endpoint, len(ns))
	for i, n := range ns {
		out[i] = k8s.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(n >> 8), byte(n)}), Port: 8080, Ready: true, Serving: true}
	}
	return out
}

func slotAddrs(l slotList) []netip.AddrPort {
	out := make([]netip.AddrPort, l.len())
	for i := range out {
		out[i] = l.addrPort(i)
	}
	return out
}

func TestNextSlots(t *testing.T) {
	tests := []struct {
		name      string
		prev, eps []k8s.Endpoint // eps sorted, as snapshots hold them
		want      []k8s.Endpoint
	}{
		{"no history: sorted", nil, eps(1, 2, 3), eps(1, 2, 3)},
		{"same endpoints keep their slots", eps(3, 1, 2), eps(1, 2, 3), eps(3, 1, 2)},
		{"a replacement takes the freed slot", eps(1, 2, 3), eps(1, 3, 4), eps(1, 4, 3)},
		{"a shrink moves the last slot into the hole", eps(1, 2, 3, 4), eps(1, 3, 4), eps(1, 4, 3)},
		{"the last one leaving moves nothing", eps(1, 2, 3, 4), eps(1, 2, 3), eps(1, 2, 3)},
		{"a growth appends", eps(3, 1, 2), eps(1, 2, 3, 4), eps(3, 1, 2, 4)},
		{"movers before new endpoints", eps(1, 2, 3, 4, 5), eps(0, 3, 5), eps(5, 0, 3)},
		{"everything new: sorted", eps(1, 2), eps(3, 4, 5), eps(3, 4, 5)},
		{"to none", eps(1, 2), nil, []k8s.Endpoint{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nextSlots(slotList{eps: tt.prev}, tt.eps)
			if d := gocmp.Diff(fmt.Sprint(slotAddrs(slotList{eps: tt.want})), fmt.Sprint(slotAddrs(got))); d != "" {
				t.Errorf("nextSlots (-want +got):\n%s", d)
			}
		})
	}
}

// wideService is one ClusterIP and NodePort service port with endpoints ns.
func wideService(ns []int) *k8s.Snapshot {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: "wide", Port: "http", Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port:       80,
		NodePort:   30080,
		Endpoints:  eps(ns...),
	}
	slices.SortFunc(sp.Endpoints, func(a, b k8s.Endpoint) int { return a.Addr.Compare(b.Addr) })
	return &k8s.Snapshot{Services: []k8s.ServicePort{sp}}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// TestWideServiceChangeIsSmall: on a service port with 5,000 endpoints, a
// replaced endpoint costs one element per map it is in (ClusterIP and
// NodePort), a removed one its hole and the last slot, an added one a slot
// and the dispatch elements moving to the next chain; and the changed
// ruleset is compileWithSlots' for the state's assignment.
func TestWideServiceChangeIsSmall(t *testing.T) {
	const n = 5000
	cfg := incrementalConfigs[0]
	tests := []struct {
		name string
		next []int
		// elements added and deleted, over every set
		adds, dels int
		chains     bool // dispatch chains change
	}{
		// ClusterIP and NodePort slot, hairpin; dispatch elements, slots
		{"replace one", slices.Concat(seq(1, 2500), seq(2501, n+1), []int{n + 1}), 2 + 1, 2 + 1, false},
		{"remove one", slices.Concat(seq(1, 2500), seq(2501, n+1)), 2 + 2, 1 + 2 + 2*2, true},
		{"add one", seq(1, n+2), 2 + 1 + 2, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prev := wideService(seq(1, n+1))
			state, applied := newIncremental(prev, cfg, nil)
			next := wideService(tt.next)
			changes, ok := updateFrom(t, state, prev, next)
			if !ok {
				t.Fatal("update refused")
			}
			count := func(ses []m.SetElements) int {
				k := 0
				for _, se := range ses {
					k += len(se.Elements)
				}
				return k
			}
			if got := count(changes.AddElements); got != tt.adds {
				t.Fatalf("added %d elements, want %d", got, tt.adds)
			}
			if got := count(changes.DelElements); got != tt.dels {
				t.Fatalf("deleted %d elements, want %d", got, tt.dels)
			}
			if got := len(changes.AddChains)+len(changes.DelChains) > 0; got != tt.chains {
				t.Errorf("chains added %d, deleted %d; want changes: %v", len(changes.AddChains), len(changes.DelChains), tt.chains)
			}
			if len(changes.AddSets)+len(changes.DelSets) > 0 {
				t.Errorf("sets added or deleted: %+v", changes)
			}
			got := applyToModel(t, applied, &changes)
			if d := gocmp.Diff(normalRender(compileWithSlots(next, cfg, state.slots)), normalRender(got)); d != "" {
				t.Errorf("changed ruleset differs from compileWithSlots (-want +got):\n%s", d)
			}
			// A full resync with the state's assignment moves nothing.
			again, rs := newIncremental(next, cfg, state.slots)
			if d := gocmp.Diff(normalRender(got), normalRender(rs)); d != "" {
				t.Errorf("full resync moved endpoints (-delta +full):\n%s", d)
			}
			if fmt.Sprint(again.slots) != fmt.Sprint(state.slots) {
				t.Error("full resync changed the slot assignment")
			}
		})
	}
}

// TestSortedWalksMatchMaps: the merge walks wide services take (sorted
// input) give what the map-based fallbacks give.
func TestSortedWalksMatchMaps(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	addr := func(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(n >> 8), byte(n)}) }
	here := mayBeHere(&k8s.Node{Name: "node-1"})
	nodes := []string{"", "node-1", "node-2"}
	for range 50 {
		var cluster, local []k8s.Endpoint
		for n := range 60 {
			if r.IntN(2) == 0 {
				cluster = append(cluster, k8s.Endpoint{Addr: addr(n), Port: uint16(8080 + r.IntN(2)), NodeName: nodes[r.IntN(3)]})
			}
			if r.IntN(4) == 0 {
				local = append(local, k8s.Endpoint{Addr: addr(n), Port: 8080, NodeName: "node-1"})
			}
		}
		choice := endpointChoice{cluster: cluster, local: local}
		got := hairpinAddrs(choice, here)
		shuffled := endpointChoice{cluster: slices.Clone(cluster), local: local}
		r.Shuffle(len(shuffled.cluster), func(i, j int) {
			shuffled.cluster[i], shuffled.cluster[j] = shuffled.cluster[j], shuffled.cluster[i]
		})
		want := hairpinAddrs(shuffled, here) // not sorted: the map
		slices.SortFunc(want, netip.Addr.Compare)
		if !slices.Equal(got, want) {
			t.Fatalf("hairpinAddrs sorted %v, by map %v", got, want)
		}
		other := hairpinAddrs(endpointChoice{cluster: local, local: cluster[:len(cluster)/2]}, here)
		onlyA, onlyB := symmetricDifference(got, other)
		rev := slices.Clone(other)
		slices.Reverse(rev) // not sorted: the map
		wantA, wantB := symmetricDifference(got, rev)
		slices.SortFunc(wantB, netip.Addr.Compare)
		if !slices.Equal(onlyA, wantA) || !slices.Equal(onlyB, wantB) {
			t.Fatalf("symmetricDifference sorted %v %v, by map %v %v", onlyA, onlyB, wantA, wantB)
		}
	}
}

// TestHairpinOnlyThisNode: the hairpin set holds the endpoints that may be on
// this node; with no Node object every endpoint counts.
func TestHairpinOnlyThisNode(t *testing.T) {
	ep := func(addr, node string) k8s.Endpoint {
		return k8s.Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, NodeName: node}
	}
	cluster := []k8s.Endpoint{ep("10.244.1.1", "node-1"), ep("10.244.2.1", "node-2"), ep("10.244.3.1", ""), ep("192.168.0.2", "node-1")}
	tests := []struct {
		name string
		node k8s.Node
		want []string
	}{
		{"this node's and unplaced endpoints", k8s.Node{Name: "node-1"}, []string{"10.244.1.1", "10.244.3.1", "192.168.0.2"}},
		{"no endpoint of another node", k8s.Node{Name: "node-3"}, []string{"10.244.3.1"}},
		{"no Node object: every endpoint", k8s.Node{Name: "node-3", Fallback: true}, []string{"10.244.1.1", "10.244.2.1", "10.244.3.1", "192.168.0.2"}},
		{"no node name: every endpoint", k8s.Node{}, []string{"10.244.1.1", "10.244.2.1", "10.244.3.1", "192.168.0.2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := hairpinAddrs(endpointChoice{cluster: cluster}, mayBeHere(&tt.node))
			var gotS []string
			for _, a := range got {
				gotS = append(gotS, a.String())
			}
			if !slices.Equal(gotS, tt.want) {
				t.Errorf("hairpin %v, want %v", gotS, tt.want)
			}
		})
	}
}

// runSource gives the same element for i whatever it was asked before: the
// batch asks in order, an error message out of order.
func TestRunSourceAnyOrder(t *testing.T) {
	eps := func(n, first int) slotList {
		var l []k8s.Endpoint
		for i := range n {
			l = append(l, k8s.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 0, byte(first + i), 1}), Port: 80})
		}
		return slotList{eps: l}
	}
	key := func(port uint32) []m.Value {
		return []m.Value{m.A(netip.MustParseAddr("10.96.0.1")), m.N(6), m.N(port)}
	}
	fixed := []m.Element{{Key: append(key(1), m.N(0)), Data: []m.Value{m.A(netip.MustParseAddr("10.1.0.1")), m.N(80)}, Comment: "fixed"}}
	runs := []slotRun{{key: key(80), eps: eps(3, 0)}, {key: key(81), eps: eps(1, 10)}, {key: key(82), eps: eps(4, 20), offset: localSlotOffset}}
	want := slices.Clone(fixed)
	for _, r := range runs {
		want = r.appendElements(want)
	}
	src := newRunSource(fixed, runs)
	if src.Len() != len(want) {
		t.Fatalf("Len %d, want %d", src.Len(), len(want))
	}
	order := append(rand.Perm(len(want)), 0, len(want)-1, 1, 2, 3, 4, 5, 6, 7)
	var e m.Element
	for _, i := range order {
		src.Element(i, &e)
		if d := gocmp.Diff(want[i], e, cmpopts.EquateComparable(netip.Addr{})); d != "" {
			t.Errorf("element %d (-want +got):\n%s", i, d)
		}
	}
}
