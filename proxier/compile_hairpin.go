// The hairpin addresses of a piece: its endpoints that may be on this node.

package proxier

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
)

// sortedByAddr tells whether endpoints are in address order, reading them in
// place (slices.IsSortedFunc would copy each large endpoint twice).
func sortedByAddr(eps []k8s.Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i].Addr.Less(eps[i-1].Addr) {
			return false
		}
	}
	return true
}

// hairpinAddrs lists the addresses of the endpoints a service port may
// send to that may be on this node, each once: a few are compared in place,
// a wide service's through a map or a merge walk. Only a packet from this
// node's own pods (or the node itself, for host-network endpoints) can be
// sent back to its source by these rules: a pod on another node reaches a
// service through its own node's proxy, and traffic from other nodes to
// external addresses and node ports is masqueraded anyway. So the hairpin
// set holds this node's endpoints, not the cluster's, and a change of a
// remote endpoint leaves it alone. here keeps the endpoints that may be on
// this node.
func hairpinAddrs(choice endpointChoice, here func(*k8s.Endpoint) bool) []netip.Addr {
	if len(choice.cluster)+len(choice.local) > 16 && sortedByAddr(choice.cluster) && sortedByAddr(choice.local) {
		return mergedAddrs(choice.cluster, choice.local, here)
	}
	out := make([]netip.Addr, 0, len(choice.local))
	var seen map[netip.Addr]bool
	if len(choice.cluster)+len(choice.local) > 16 {
		seen = make(map[netip.Addr]bool, len(choice.local))
	}
	for _, eps := range [][]k8s.Endpoint{choice.cluster, choice.local} {
		for i := range eps {
			e := &eps[i]
			switch {
			case !here(e):
				continue
			case seen != nil && seen[e.Addr], seen == nil && slices.Contains(out, e.Addr):
				continue
			case seen != nil:
				seen[e.Addr] = true
			}
			out = append(out, e.Addr)
		}
	}
	return out
}

// mayBeHere tells whether an endpoint may be on this node: it is, its node
// is not known, or this node's name is not known for sure (no Node object:
// then every endpoint counts, so that a name that does not match the
// cluster's costs no hairpin).
func mayBeHere(node *k8s.Node) func(*k8s.Endpoint) bool {
	if node.Name == "" || node.Fallback {
		return func(*k8s.Endpoint) bool { return true }
	}
	return func(e *k8s.Endpoint) bool { return e.NodeName == "" || e.NodeName == node.Name }
}

// mergedAddrs lists the addresses of two address-sorted endpoint lists that
// keep keeps, each once, sorted: a wide service's in one walk, without a map.
func mergedAddrs(a, b []k8s.Endpoint, keep func(*k8s.Endpoint) bool) []netip.Addr {
	// Counted first: a wide service's piece keeps the list, and on a node
	// that holds few of its endpoints room for all would be wasted.
	n := 0
	for _, eps := range [][]k8s.Endpoint{a, b} {
		for i := range eps {
			if keep(&eps[i]) {
				n++
			}
		}
	}
	out := make([]netip.Addr, 0, n)
	add := func(e *k8s.Endpoint) {
		if keep(e) && (len(out) == 0 || out[len(out)-1] != e.Addr) {
			out = append(out, e.Addr)
		}
	}
	for len(a) > 0 || len(b) > 0 {
		if c := walkOrder(len(a), len(b), func() int { return a[0].Addr.Compare(b[0].Addr) }); c <= 0 {
			add(&a[0])
			a = a[1:]
		} else {
			add(&b[0])
			b = b[1:]
		}
	}
	return out
}
