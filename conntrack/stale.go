package conntrack

import (
	"bytes"
	"cmp"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
)

// Stale returns the flows that must be deleted after the ruleset of prev was
// replaced by the ruleset of next, in the order they appear in flows.
//
// A service address is a ClusterIP, ExternalIP or LoadBalancer IP with the
// service port, or a node address with the NodePort; node addresses are
// next.Node.Addrs (prev.Node.Addrs for prev) plus localAddrs, the other local
// addresses the NodePort rules accept. Only UDP and SCTP service ports count.
// A flow is stale when its original destination is a service address of prev
// or next and either
//   - it was DNATed to an address that is not a serving (Ready or Serving)
//     endpoint of that service port in next — the endpoint went away, moved,
//     or the whole service did; or
//   - it was not DNATed, and the service port has serving endpoints in next
//     but had none in prev: its packets met a reject (or no rule at all) and
//     would keep missing the new endpoints.
//
// A nil prev means the previous ruleset is unknown (the first sync after the
// daemon started): every service port is then taken to have had no endpoints.
// Flows of other protocols, to other destinations, or DNATed to endpoints that
// still serve are never selected.
func Stale(flows []Flow, prev, next *k8s.Snapshot, localAddrs ...netip.Addr) []Flow {
	s := newSelector(prev, next, localAddrs)
	var out []Flow
	for _, f := range flows {
		if s.stale(f) {
			out = append(out, f)
		}
	}
	return out
}

// epKey is an address and port as plain bytes: map keys of this kind hash
// several times faster than netip values, which carry a zone pointer.
type epKey struct {
	addr [16]byte
	port uint16
}

func keyOf(ap netip.AddrPort) epKey {
	return epKey{norm(ap.Addr()).As16(), ap.Port()}
}

func compareEP(a, b epKey) int {
	if c := bytes.Compare(a.addr[:], b.addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.port, b.port)
}

// vipKey is a service address: protocol, address and port.
type vipKey struct {
	dst   epKey
	proto uint8
}

// endpointSet holds the serving endpoints of a service port, sorted and
// without duplicates. All addresses of a service port share one set, and the
// sets of a snapshot share one backing array: building the index for 10,000
// services then costs a handful of allocations instead of one map each.
type endpointSet []epKey

func (s endpointSet) has(k epKey) bool {
	_, ok := slices.BinarySearchFunc(s, k, compareEP)
	return ok
}

// subsetOf reports whether every element of s is in t; both are sorted.
func (s endpointSet) subsetOf(t endpointSet) bool {
	j := 0
	for _, k := range s {
		for j < len(t) && compareEP(t[j], k) < 0 {
			j++
		}
		if j == len(t) || t[j] != k {
			return false
		}
	}
	return true
}

// union returns s ∪ t, sharing s or t when the other is empty. Two service
// ports on one address are a misconfiguration; the union keeps every flow
// either of them could have made.
func union(s, t endpointSet) endpointSet {
	switch {
	case len(s) == 0:
		return t
	case len(t) == 0:
		return s
	}
	u := make(endpointSet, 0, len(s)+len(t))
	u = append(append(u, s...), t...)
	slices.SortFunc(u, compareEP)
	return slices.Compact(u)
}

type target struct {
	prev, next endpointSet // empty when the address had no serving endpoints
}

// selector is the index Stale builds from the two snapshots.
type selector struct {
	index       map[vipKey]int32 // into targets
	targets     []target
	unknownPrev bool
}

func newSelector(prev, next *k8s.Snapshot, localAddrs []netip.Addr) *selector {
	s := &selector{unknownPrev: prev == nil}
	n := 0
	for _, snap := range []*k8s.Snapshot{prev, next} {
		if snap != nil {
			n = max(n, len(snap.Services))
		}
	}
	s.index = make(map[vipKey]int32, n)
	if prev != nil {
		s.add(prev, localAddrs, func(t *target) *endpointSet { return &t.prev })
	}
	if next != nil {
		s.add(next, localAddrs, func(t *target) *endpointSet { return &t.next })
	}
	return s
}

// add indexes every UDP and SCTP service address of snap; side picks which
// of the target's sets the snapshot fills.
func (s *selector) add(snap *k8s.Snapshot, localAddrs []netip.Addr, side func(*target) *endpointSet) {
	nodeAddrs := make([]netip.Addr, 0, len(snap.Node.Addrs)+len(localAddrs))
	nodeAddrs = append(nodeAddrs, snap.Node.Addrs...)
	nodeAddrs = append(nodeAddrs, localAddrs...)
	total := 0
	for i := range snap.Services {
		total += len(snap.Services[i].Endpoints)
	}
	backing := make([]epKey, 0, total)
	for i := range snap.Services {
		sp := &snap.Services[i]
		if sp.Name.Protocol != k8s.UDP && sp.Name.Protocol != k8s.SCTP {
			continue
		}
		proto := sp.Name.Protocol.Number()
		var eps endpointSet
		backing, eps = servingEndpoints(backing, sp.Endpoints)
		put := func(a netip.Addr, port uint16) {
			k := vipKey{keyOf(netip.AddrPortFrom(a, port)), proto}
			i, ok := s.index[k]
			if !ok {
				i = int32(len(s.targets))
				s.targets = append(s.targets, target{})
				s.index[k] = i
			}
			set := side(&s.targets[i])
			*set = union(*set, eps)
		}
		for _, a := range sp.ClusterIPs {
			put(a, sp.Port)
		}
		for _, a := range sp.ExternalIPs {
			put(a, sp.Port)
		}
		for _, a := range sp.LoadBalancerIPs {
			put(a, sp.Port)
		}
		if sp.NodePort != 0 {
			for _, a := range nodeAddrs {
				put(a, sp.NodePort)
			}
		}
	}
}

// servingEndpoints appends the endpoints that may receive new flows to
// backing and returns them as a set. Terminating endpoints that still serve
// count: the proxier falls back to them, and cutting their flows early is
// exactly what graceful termination tries to avoid.
func servingEndpoints(backing []epKey, eps []k8s.Endpoint) ([]epKey, endpointSet) {
	start := len(backing)
	for _, e := range eps {
		if e.Ready || e.Serving {
			backing = append(backing, keyOf(netip.AddrPortFrom(e.Addr, e.Port)))
		}
	}
	// The full slice expression keeps a later union from writing into the
	// next service's endpoints.
	set := endpointSet(backing[start:len(backing):len(backing)])
	if !slices.IsSortedFunc(set, compareEP) {
		slices.SortFunc(set, compareEP)
	}
	return backing, slices.Compact(set)
}

func (s *selector) stale(f Flow) bool {
	if f.Proto != protoUDP && f.Proto != protoSCTP {
		return false
	}
	i, ok := s.index[vipKey{keyOf(f.OrigDst), f.Proto}]
	if !ok {
		return false
	}
	t := &s.targets[i]
	if f.DNAT() {
		return !t.next.has(keyOf(f.ReplySrc))
	}
	return len(t.next) > 0 && (s.unknownPrev || len(t.prev) == 0)
}

// mayHaveStale reports whether the change from prev to next can have left
// stale flows behind, assuming every earlier change was reconciled: some
// service address lost a serving endpoint (or disappeared), or got its first
// ones. When it reports false the reconciler skips the dump, which costs
// time proportional to the whole conntrack table.
func (s *selector) mayHaveStale() bool {
	if s.unknownPrev {
		return len(s.targets) > 0
	}
	for i := range s.targets {
		t := &s.targets[i]
		if len(t.prev) == 0 && len(t.next) > 0 || !t.prev.subsetOf(t.next) {
			return true
		}
	}
	return false
}
