package conntrack

import (
	"net/netip"

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

// vipKey is a service address: protocol, address and port.
type vipKey struct {
	proto uint8
	dst   netip.AddrPort
}

// endpointSet holds the serving endpoints of a service port. One set is
// shared by all addresses of the service port.
type endpointSet map[netip.AddrPort]struct{}

type target struct {
	prev, next endpointSet // nil when the address had no serving endpoints
}

// selector is the index Stale builds from the two snapshots.
type selector struct {
	targets     map[vipKey]*target
	unknownPrev bool
}

func newSelector(prev, next *k8s.Snapshot, localAddrs []netip.Addr) *selector {
	s := &selector{targets: make(map[vipKey]*target), unknownPrev: prev == nil}
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
	for i := range snap.Services {
		sp := &snap.Services[i]
		if sp.Name.Protocol != k8s.UDP && sp.Name.Protocol != k8s.SCTP {
			continue
		}
		proto := sp.Name.Protocol.Number()
		eps := servingEndpoints(sp.Endpoints)
		put := func(a netip.Addr, port uint16) {
			k := vipKey{proto, netip.AddrPortFrom(norm(a), port)}
			t := s.targets[k]
			if t == nil {
				t = &target{}
				s.targets[k] = t
			}
			set := side(t)
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

// servingEndpoints returns the endpoints that may receive new flows, or nil.
// Terminating endpoints that still serve count: the proxier falls back to
// them, and cutting their flows early is exactly what graceful termination
// tries to avoid.
func servingEndpoints(eps []k8s.Endpoint) endpointSet {
	var set endpointSet
	for _, e := range eps {
		if !e.Ready && !e.Serving {
			continue
		}
		if set == nil {
			set = make(endpointSet, len(eps))
		}
		set[netip.AddrPortFrom(norm(e.Addr), e.Port)] = struct{}{}
	}
	return set
}

// union returns a ∪ b, sharing a or b when the other is empty. Two service
// ports on one address are a misconfiguration; the union keeps every flow
// either of them could have made.
func union(a, b endpointSet) endpointSet {
	switch {
	case len(a) == 0:
		return b
	case len(b) == 0:
		return a
	}
	u := make(endpointSet, len(a)+len(b))
	for ep := range a {
		u[ep] = struct{}{}
	}
	for ep := range b {
		u[ep] = struct{}{}
	}
	return u
}

func (s *selector) stale(f Flow) bool {
	if f.Proto != protoUDP && f.Proto != protoSCTP {
		return false
	}
	t := s.targets[vipKey{f.Proto, normAP(f.OrigDst)}]
	if t == nil {
		return false
	}
	if f.DNAT() {
		_, serving := t.next[normAP(f.ReplySrc)]
		return !serving
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
	for _, t := range s.targets {
		if len(t.prev) == 0 && len(t.next) > 0 {
			return true
		}
		for ep := range t.prev {
			if _, ok := t.next[ep]; !ok {
				return true
			}
		}
	}
	return false
}
