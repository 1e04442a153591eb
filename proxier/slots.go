package proxier

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/nftproxy/nftproxy/k8s"
)

// Slots is a slot assignment: which endpoint of a service port sits in which
// slot of the endpoint maps (`… . numgen random mod N`). It is history, not a
// function of the snapshot: when an endpoint is replaced, the new one takes
// the freed slot so that the kernel changes one element, not every slot
// after it. A service port whose endpoints sit in their sorted order (the
// snapshot's) has no entry; Compile uses that order for every port.
//
// An entry is the slot list itself, which points into a snapshot's
// endpoints (never modified in place): a wide service's change keeps the new
// order without copying thousands of addresses out of it.
type Slots map[slotsKey]slotList

// slotsKey names one list of endpoints a service port dispatches to: the
// cluster-wide list, or the local one (ClusterIP traffic with
// internalTrafficPolicy Local).
type slotsKey struct {
	port  k8s.ServicePortName
	local bool
}

// slotOrder is the order a piece put one endpoint list in.
type slotOrder struct {
	key   slotsKey
	order slotList
}

// sorted tells whether the order is the snapshot's own.
func (o slotOrder) sorted() bool { return o.order.perm == nil && o.order.tab == nil }

// slotList is endpoints in slot order: eps as they are, or, with perm,
// eps[perm[slot]] in each slot. A reordering costs a permutation, not a
// copy of every endpoint (they are large, and a wide service has thousands).
// A wide list patched by an endpoint delta is instead its first n slots of
// tab, which the incremental state changes in place (patch.go).
type slotList struct {
	eps  []k8s.Endpoint
	perm []int32 // nil: eps's own order
	tab  *slotTable
	n    int // with tab: the list's length
}

func (l slotList) len() int {
	if l.tab != nil {
		return l.n
	}
	return len(l.eps)
}

// addrPort is the endpoint in slot i.
func (l slotList) addrPort(i int) netip.AddrPort {
	switch {
	case l.tab != nil:
		return l.tab.keys[i]
	case l.perm != nil:
		return addrPort(&l.eps[l.perm[i]])
	}
	return addrPort(&l.eps[i])
}

func addrPort(e *k8s.Endpoint) netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// nextSlots orders eps (sorted) into slots given the previous order prev:
// an endpoint that stays keeps its slot when that slot still exists; the
// freed slots below len(eps) are filled first by the endpoints that sat in
// slots beyond len(eps) (a shrink moves the last one into the hole), then by
// the new endpoints in their sorted order (a replacement takes the freed
// slot; a growth appends). With no previous order the result is eps.
func nextSlots(prev slotList, eps []k8s.Endpoint) slotList {
	if prev.len() == 0 {
		return slotList{eps: eps}
	}
	find := indexOf(eps)
	out := make([]int32, len(eps))
	placed := make([]bool, len(eps)) // by index in eps
	filled := make([]bool, len(eps)) // by slot
	var movers []int                 // indexes in eps waiting for a slot
	// An order that was sorted, or is after a few changes, holds the
	// endpoint of a slot at the index the previous slot's had plus one:
	// tried first, it spares most look-ups.
	off := 0
	for slot := range prev.len() {
		a := prev.addrPort(slot)
		i, ok := slot+off, true
		if i < 0 || i >= len(eps) || addrPort(&eps[i]) != a {
			if i, ok = find(a); ok {
				off = i - slot
			}
		}
		if !ok || placed[i] {
			continue
		}
		placed[i] = true
		if slot < len(eps) {
			out[slot], filled[slot] = int32(i), true
		} else {
			movers = append(movers, i)
		}
	}
	for i := range eps {
		if !placed[i] {
			movers = append(movers, i)
		}
	}
	for slot := range out {
		if !filled[slot] {
			out[slot] = int32(movers[0])
			movers = movers[1:]
		}
	}
	if isIdentity(out) {
		return slotList{eps: eps}
	}
	return slotList{eps: eps, perm: out}
}

// isIdentity tells whether a permutation leaves every slot in place.
func isIdentity(perm []int32) bool {
	for i, j := range perm {
		if int(j) != i {
			return false
		}
	}
	return true
}

// slotsOf puts eps, the endpoint list key of a service port, in slot order
// after the compiler's previous assignment, and notes the order in p.
func (c *compiler) slotsOf(p *piece, key slotsKey, eps []k8s.Endpoint) slotList {
	// Every address of the port dispatches to the same list: ordered once.
	if i := slices.IndexFunc(p.slotOrders, func(o slotOrder) bool { return o.key == key }); i >= 0 {
		return p.slotOrders[i].order
	}
	order := nextSlots(c.slots[key], eps)
	p.slotOrders = append(p.slotOrders, slotOrder{key: key, order: order})
	return order
}

// indexOf returns a look-up of an endpoint's index in eps: a binary search
// when eps is sorted, as the tracker hands them over (a wide service's
// thousands then cost no map), a map otherwise.
func indexOf(eps []k8s.Endpoint) func(netip.AddrPort) (int, bool) {
	sorted := true
	for i := 1; i < len(eps) && sorted; i++ {
		sorted = addrPort(&eps[i-1]).Compare(addrPort(&eps[i])) <= 0
	}
	if sorted {
		return func(a netip.AddrPort) (int, bool) {
			// sort.Search reads the endpoints in place, where
			// slices.BinarySearchFunc would copy each it compares.
			i := sort.Search(len(eps), func(i int) bool { return addrPort(&eps[i]).Compare(a) >= 0 })
			return i, i < len(eps) && addrPort(&eps[i]) == a
		}
	}
	index := make(map[netip.AddrPort]int, len(eps))
	for i := range eps {
		index[addrPort(&eps[i])] = i
	}
	return func(a netip.AddrPort) (int, bool) { i, ok := index[a]; return i, ok }
}
