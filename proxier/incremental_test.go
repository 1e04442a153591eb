package proxier

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// randomSnapshots walks a random sequence of snapshots: each step adds,
// changes or removes a few of a small pool of service ports, so endpoints,
// chains and slots are shared, released and taken over all the time.
type randomSnapshots struct {
	r    *rand.Rand
	svcs map[int]k8s.ServicePort
	node k8s.Node
}

func newRandomSnapshots(seed uint64) *randomSnapshots {
	return &randomSnapshots{r: rand.New(rand.NewPCG(seed, 1)), svcs: map[int]k8s.ServicePort{},
		node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Zone: "a"}}
}

const randomPool = 12

func (g *randomSnapshots) next() *k8s.Snapshot {
	for range 1 + g.r.IntN(3) {
		i := g.r.IntN(randomPool)
		if g.r.IntN(5) == 0 {
			delete(g.svcs, i)
		} else {
			g.svcs[i] = g.service(i)
		}
	}
	snap := &k8s.Snapshot{Node: g.node}
	for i := range randomPool {
		if sp, ok := g.svcs[i]; ok {
			snap.Services = append(snap.Services, sp)
		}
	}
	return snap
}

func (g *randomSnapshots) service(i int) k8s.ServicePort {
	r := g.r
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: fmt.Sprintf("svc-%02d", i), Port: "p", Protocol: []k8s.Protocol{k8s.TCP, k8s.UDP}[i%2]},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})},
		Port:       uint16(80 + i%3),
	}
	if r.IntN(3) == 0 {
		sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i+1)))
	}
	if r.IntN(2) == 0 {
		sp.NodePort = uint16(30000 + i)
	}
	if r.IntN(4) == 0 {
		sp.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})}
	}
	if r.IntN(4) == 0 {
		sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})}
		if r.IntN(2) == 0 {
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
		}
	}
	sp.ExternalPolicyLocal = r.IntN(4) == 0
	if sp.ExternalPolicyLocal && r.IntN(2) == 0 {
		sp.HealthCheckNodePort = uint16(31000 + i)
	}
	sp.InternalPolicyLocal = r.IntN(6) == 0
	if r.IntN(4) == 0 {
		sp.AffinityTimeout = 3 * time.Hour
	}
	// Endpoints from a small pool, so several services share addresses.
	for _, n := range r.Perm(8)[:r.IntN(5)] {
		e := k8s.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(n + 1)}), Port: 8080,
			Ready: r.IntN(5) > 0, NodeName: fmt.Sprintf("node-%d", 1+n%2)}
		e.Serving = e.Ready || r.IntN(2) == 0
		e.Terminating = !e.Ready
		if r.IntN(3) == 0 {
			e.Addr = netip.MustParseAddr(fmt.Sprintf("fd00:244::%x", n+1))
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
	slices.SortFunc(sp.Endpoints, func(a, b k8s.Endpoint) int { return a.Addr.Compare(b.Addr) })
	return sp
}

// updateFrom is the proxier's delta sync of one family: the service ports
// that differ between two snapshots, then the update.
func updateFrom(t *testing.T, s *incremental, prev, next *k8s.Snapshot) (m.Changes, bool) {
	t.Helper()
	return s.update(next.Node, next.ServiceCIDRs, diffPorts(portsOf(prev), next))
}

var incrementalConfigs = []Config{
	{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
	{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}},
}

// TestIncrementalMatchesCompile: after every step of random sequences, the
// applied ruleset changed by the incremental compiler's changes is the one
// Compile builds from scratch, and the changes are valid in the order the
// applier sends them.
func TestIncrementalMatchesCompile(t *testing.T) {
	defer func(v int) { wideFrom = v }(wideFrom)
	for _, cfg := range incrementalConfigs {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("%s/seed=%d", cfg.Family, seed), func(t *testing.T) {
				// Every other seed puts lists of two endpoints or more in
				// the wide maps: the random counts cross it both ways.
				wideFrom = []int{64, 2}[seed%2]
				g := newRandomSnapshots(seed)
				snap := g.next()
				state, applied := newIncremental(snap, cfg, nil)
				for step := range 60 {
					prev := snap
					snap = g.next()
					changes, ok := updateFrom(t, state, prev, snap)
					want := compileWithSlots(snap, cfg, state.slots)
					if !ok {
						// Only an affinity timeout change can't be made
						// incrementally, and the generator makes none.
						t.Fatalf("step %d: update refused", step)
					}
					applied = applyToModel(t, applied, &changes)
					if diff := gocmp.Diff(normalRender(want), normalRender(applied)); diff != "" {
						t.Fatalf("step %d: incremental result differs from Compile (-compiled +incremental):\n%s", step, diff)
					}
					if got, want := state.elements(), countElements(want); got != want {
						t.Fatalf("step %d: elements() = %d, the ruleset has %d", step, got, want)
					}
					// Per set too: fits decides on these.
					for _, decl := range state.c.fixedSets() {
						for _, set := range want.Sets {
							if set.Name == decl.Name && state.counts[decl] != len(set.Elements) {
								t.Fatalf("step %d: set %s counted %d elements, holds %d", step, set.Name, state.counts[decl], len(set.Elements))
							}
						}
					}
				}
			})
		}
	}
}

func TestIncrementalNoChange(t *testing.T) {
	g := newRandomSnapshots(7)
	snap := g.next()
	for range 5 {
		snap = g.next()
	}
	state, _ := newIncremental(snap, incrementalConfigs[0], nil)
	// A snapshot built anew (no shared endpoint arrays) changes nothing.
	again := &k8s.Snapshot{Node: snap.Node}
	for _, sp := range snap.Services {
		sp.Endpoints = slices.Clone(sp.Endpoints)
		again.Services = append(again.Services, sp)
	}
	changes, ok := updateFrom(t, state, snap, again)
	if !ok || !changes.Empty() {
		t.Fatalf("update with an equal snapshot = %+v, %v; want no changes", changes, ok)
	}
}

// TestIncrementalRefusesContextChange: what every piece depends on (the
// node for the endpoint choice, the service CIDRs for the fixed chains)
// changed, so everything must be compiled again.
func TestIncrementalRefusesContextChange(t *testing.T) {
	for name, change := range map[string]func(*k8s.Snapshot){
		"node zone":     func(s *k8s.Snapshot) { s.Node.Zone = "b" },
		"service CIDRs": func(s *k8s.Snapshot) { s.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")} },
	} {
		snap := newRandomSnapshots(3).next()
		state, _ := newIncremental(snap, incrementalConfigs[0], nil)
		changed := *snap
		change(&changed)
		if _, ok := updateFrom(t, state, snap, &changed); ok {
			t.Errorf("%s changed: update succeeded, want a full sync", name)
		}
	}
}

// TestSameServicePortSeesEveryField changes each field of a service port and
// of an endpoint in turn: sameServicePort must notice, or a change of a
// field added later would never reach the kernel.
func TestSameServicePortSeesEveryField(t *testing.T) {
	base := newRandomSnapshots(1).service(3)
	base.Endpoints = []k8s.Endpoint{{Addr: netip.MustParseAddr("10.244.0.1"), Port: 1}}
	mutate := func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Uint8, reflect.Uint16, reflect.Uint32:
			v.SetUint(v.Uint() + 1)
		case reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Slice:
			v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
		case reflect.Pointer:
			if x, ok := v.Addr().Interface().(**k8s.Hints); ok {
				*x = &k8s.Hints{Zones: []string{"x"}}
				return
			}
			t.Fatalf("no mutation for %s", v.Type())
		case reflect.Struct:
			switch x := v.Addr().Interface().(type) {
			case *netip.Addr:
				*x = netip.MustParseAddr("192.0.2.99")
			case *k8s.ServicePortName:
				x.Name += "x"
			default:
				t.Fatalf("no mutation for %s", v.Type())
			}
		default:
			t.Fatalf("no mutation for %s", v.Type())
		}
	}
	spT := reflect.TypeFor[k8s.ServicePort]()
	for i := range spT.NumField() {
		if spT.Field(i).Name == "Endpoints" {
			continue
		}
		b := base
		b.ClusterIPs, b.ExternalIPs = slices.Clone(b.ClusterIPs), slices.Clone(b.ExternalIPs)
		mutate(reflect.ValueOf(&b).Elem().Field(i))
		if sameServicePort(&base, &b) {
			t.Errorf("sameServicePort misses a change of %s", spT.Field(i).Name)
		}
	}
	epT := reflect.TypeFor[k8s.Endpoint]()
	for i := range epT.NumField() {
		b := base
		b.Endpoints = slices.Clone(base.Endpoints)
		mutate(reflect.ValueOf(&b.Endpoints[0]).Elem().Field(i))
		if sameServicePort(&base, &b) {
			t.Errorf("sameServicePort misses a change of Endpoint.%s", epT.Field(i).Name)
		}
	}
	// And within the hints.
	zones, nodes := base, base
	zones.Endpoints = []k8s.Endpoint{base.Endpoints[0]}
	nodes.Endpoints = []k8s.Endpoint{base.Endpoints[0]}
	zones.Endpoints[0].Hints = &k8s.Hints{Zones: []string{"a"}}
	nodes.Endpoints[0].Hints = &k8s.Hints{Nodes: []string{"a"}}
	if sameServicePort(&zones, &nodes) {
		t.Error("sameServicePort takes a zone hint for a node hint")
	}
}

// TestIncrementalThroughNetlink sends the incremental changes of a random
// sequence over netlink: the kernel takes every batch, and the table read
// back (nftnl.Read, which lists as nft does) is Compile's ruleset at the end.
func TestIncrementalThroughNetlink(t *testing.T) {
	// Lists of two endpoints or more go to the wide maps: the random
	// counts cross it both ways, and the kernel takes the moves.
	defer func(v int) { wideFrom = v }(wideFrom)
	wideFrom = 2
	ns := netns.New(t, "pxi")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for _, cfg := range incrementalConfigs {
		g := newRandomSnapshots(11)
		snap := g.next()
		state, rs := newIncremental(snap, cfg, nil)
		if _, err := nftnl.Apply(conn, rs); err != nil {
			t.Fatalf("apply: %v", err)
		}
		for step := range 80 {
			prev := snap
			snap = g.next()
			changes, ok := updateFrom(t, state, prev, snap)
			if !ok {
				t.Fatalf("step %d: update refused", step)
			}
			if _, err := nftnl.ApplyChanges(conn, cfg.Family, TableName, &changes); err != nil {
				t.Fatalf("step %d: apply changes: %v", step, err)
			}
		}
		read, err := nftnl.Read(conn, cfg.Family, TableName)
		if err != nil {
			t.Fatal(err)
		}
		if diff := gocmp.Diff(sortedBlocks(m.Render(compileWithSlots(snap, cfg, state.slots))), sortedBlocks(m.Render(read))); diff != "" {
			t.Errorf("%s: listed table differs from Compile (-compiled +listed):\n%s", cfg.Family, diff)
		}
	}
}

// applyToModel changes a copy of rs as the netlink applier changes the
// kernel, step by step in its order, and fails t where the kernel would
// refuse: adding what exists, removing what doesn't.
func applyToModel(t *testing.T, rs *m.Ruleset, c *m.Changes) *m.Ruleset {
	t.Helper()
	sets := map[string]*m.Set{}
	for _, s := range rs.Sets {
		cp := *s
		cp.Elements, cp.Source = slices.Clone(s.All()), nil
		sets[s.Name] = &cp
	}
	chains := map[string]*m.Chain{}
	for _, ch := range rs.Chains {
		chains[ch.Name] = ch
	}
	index := func(s *m.Set, e m.Element) int {
		k := string(m.KeyBytes(s.Key, e.Key))
		return slices.IndexFunc(s.Elements, func(x m.Element) bool { return string(m.KeyBytes(s.Key, x.Key)) == k })
	}
	for _, s := range c.AddSets {
		if sets[s.Name] != nil {
			t.Fatalf("add set %s: exists", s.Name)
		}
		cp := *s
		cp.Elements = nil
		sets[s.Name] = &cp
	}
	for _, ch := range c.AddChains {
		if chains[ch.Name] != nil {
			t.Fatalf("add chain %s: exists", ch.Name)
		}
		chains[ch.Name] = &m.Chain{Name: ch.Name, Base: ch.Base}
	}
	for _, se := range c.DelElements {
		s := sets[se.Set]
		if s == nil {
			t.Fatalf("delete elements of %s: no such set", se.Set)
		}
		for _, e := range se.Elements {
			i := index(s, e)
			if i < 0 {
				t.Fatalf("delete element %v of %s: not there", e.Key, se.Set)
			}
			s.Elements = slices.Delete(s.Elements, i, i+1)
		}
	}
	for _, ch := range c.RewriteChains {
		if chains[ch.Name] == nil {
			t.Fatalf("rewrite chain %s: no such chain", ch.Name)
		}
		chains[ch.Name] = ch
	}
	for _, s := range c.AddSets {
		sets[s.Name].Elements = append(sets[s.Name].Elements, s.Elements...)
	}
	for _, se := range c.AddElements {
		s := sets[se.Set]
		if s == nil {
			t.Fatalf("add elements to %s: no such set", se.Set)
		}
		for _, e := range se.Elements {
			if index(s, e) >= 0 {
				t.Fatalf("add element %v to %s: exists", e.Key, se.Set)
			}
			s.Elements = append(s.Elements, e)
		}
	}
	for _, name := range c.DelSets {
		if sets[name] == nil {
			t.Fatalf("delete set %s: no such set", name)
		}
		delete(sets, name)
	}
	for _, name := range c.DelChains {
		if chains[name] == nil {
			t.Fatalf("delete chain %s: no such chain", name)
		}
		delete(chains, name)
	}
	out := &m.Ruleset{Family: rs.Family, Table: rs.Table}
	for _, s := range sets {
		out.Sets = append(out.Sets, s)
	}
	for _, ch := range chains {
		out.Chains = append(out.Chains, ch)
	}
	return out
}

// normalRender renders rs with sets and chains in name order.
func normalRender(rs *m.Ruleset) string {
	n := &m.Ruleset{Family: rs.Family, Table: rs.Table, Chains: slices.Clone(rs.Chains)}
	for _, s := range rs.Sets {
		cp := *s
		cp.Elements, cp.Source = m.SortedElements(s), nil
		n.Sets = append(n.Sets, &cp)
	}
	slices.SortFunc(n.Sets, func(a, b *m.Set) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(n.Chains, func(a, b *m.Chain) int { return cmp.Compare(a.Name, b.Name) })
	return m.Render(n)
}

// sortedBlocks sorts the top-level blocks (sets, maps, chains) of a table
// listing: the kernel lists chains in the order they were added.
func sortedBlocks(listing string) []string {
	lines := strings.Split(strings.TrimSpace(listing), "\n")
	body := strings.Join(lines[1:len(lines)-1], "\n") // inside "table … {" and "}"
	var blocks []string
	for b := range strings.SplitSeq(body, "\n\n") {
		blocks = append(blocks, strings.TrimSpace(b))
	}
	slices.Sort(blocks)
	return blocks
}

func countElements(rs *m.Ruleset) int {
	n := 0
	for _, s := range rs.Sets {
		n += len(s.Elements)
	}
	return n
}

// TestFullSyncSetsHaveSources: the ruleset a full sync applies leaves the
// elements of its largest sets (endpoint maps, hairpin, cluster IPs) to
// sources, so that they are never held as a model; what the sources make is
// checked by the golden rulesets (Compile holds them) and, encoded, by
// nftnl's TestDifferential.
func TestFullSyncSetsHaveSources(t *testing.T) {
	snap := newRandomSnapshots(11).next()
	for _, cfg := range incrementalConfigs {
		state, rs := newIncremental(snap, cfg, nil)
		for _, s := range rs.Sets {
			want := slices.ContainsFunc([]*m.Set{state.c.endpoints, state.c.nodePortEndpoints, state.c.wideEndpoints,
				state.c.wideNodePortEndpoints, state.c.hairpin, state.c.clusterIPs}, func(d *m.Set) bool { return d.Name == s.Name })
			if (s.Source != nil) != want {
				t.Errorf("%s: set %s has a source: %v, want %v", cfg.Family, s.Name, s.Source != nil, want)
			}
		}
	}
}
