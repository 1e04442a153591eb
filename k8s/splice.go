// A service's merged endpoints, patched with the one slice that changed.

package k8s

import (
	"cmp"
	"maps"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/types"
)

// patchMerged brings the merged ports of service svc from slice old to
// slice new (both its own, new already in t.byService), splicing the one
// slice's changed endpoints into each port's list instead of merging every
// slice again: a service of 50 slices costs a binary search per changed
// endpoint and a copy of its list. It reports false, changing nothing, when
// the service has no merged ports, has one slice (whose list the merge takes
// as it is), or has an address and port in more than one slice, whose tie
// the full merge must break.
func (t *Tracker) patchMerged(svc types.NamespacedName, old, new *SliceEndpoints) bool {
	merged, ok := t.merged[svc]
	// Spliced once per hand-over: a burst of changes to one service (a
	// rollout) costs one merge when the ports are next read, not a copy of
	// the list per change.
	if !ok || len(t.byService[svc]) < 2 || t.spliced[svc] {
		return false
	}
	// A new list: the old one may be the snapshot's, never modified.
	out := slices.Clone(merged)
	deltas := map[ServicePortName]*EndpointDelta{}
	for i := range out {
		sp := &out[i]
		removed, added := changedEndpoints(portEndpoints(old, sp.Name), portEndpoints(new, sp.Name))
		eps, ok := spliceEndpoints(sp.Endpoints, removed, added)
		// Every slice's endpoints are in the merged list once when their
		// count is its length: none was a duplicate the merge dropped.
		if !ok || len(eps) != t.countEndpoints(svc, sp.Name) {
			return false
		}
		if len(removed)+len(added) > 0 {
			deltas[sp.Name] = &EndpointDelta{From: sp.Endpoints, To: eps, Removed: removed, Added: added}
		}
		sp.Endpoints = eps
	}
	t.merged[svc] = out
	t.spliced[svc] = true
	maps.Copy(t.deltas, deltas)
	return true
}

// forgetSplices notes that the merged ports were read: the next change of
// each service may splice again. (A new map, as TakeChanges makes its dirty
// set: clearing one costs its capacity, which a relist may have grown.)
func (t *Tracker) forgetSplices() {
	if len(t.spliced) > 0 {
		t.spliced = map[types.NamespacedName]bool{}
	}
	// Handed over by TakeChanges, or of no use after a snapshot; either way
	// they must not hold old lists.
	if len(t.deltas) > 0 {
		t.deltas = map[ServicePortName]*EndpointDelta{}
	}
}

// portEndpoints lists the endpoints of port name in slice s (nil: none),
// sorted.
func portEndpoints(s *SliceEndpoints, name ServicePortName) []Endpoint {
	if s == nil {
		return nil
	}
	var out []Endpoint
	lists := 0
	for _, pe := range s.Ports {
		if pe.serves(name) {
			if lists == 0 {
				out = pe.Endpoints // shared, as it is never modified
			} else {
				out = append(slices.Clip(out), pe.Endpoints...)
			}
			lists++
		}
	}
	if lists > 1 {
		slices.SortFunc(out, func(a, b Endpoint) int { return compareEndpointKeys(&a, &b) })
	}
	return out
}

// changedEndpoints returns what of old (sorted) new (sorted) does not have
// as it is, and what of new old does not: an endpoint replaced in a slice of
// a hundred is one out and one in.
func changedEndpoints(old, new []Endpoint) (removed, added []Endpoint) {
	for len(old) > 0 && len(new) > 0 {
		switch c := compareEndpointKeys(&old[0], &new[0]); {
		case c < 0:
			removed = append(removed, old[0])
			old = old[1:]
		case c > 0:
			added = append(added, new[0])
			new = new[1:]
		default:
			if !old[0].Equal(&new[0]) {
				removed, added = append(removed, old[0]), append(added, new[0])
			}
			old, new = old[1:], new[1:]
		}
	}
	return append(removed, old...), append(added, new...)
}

// countEndpoints adds up the endpoints the service's slices hold for a port.
func (t *Tracker) countEndpoints(svc types.NamespacedName, name ServicePortName) int {
	n := 0
	for _, s := range t.byService[svc] {
		for _, pe := range s.Ports {
			if pe.serves(name) {
				n += len(pe.Endpoints)
			}
		}
	}
	return n
}

func compareEndpointKeys(a, b *Endpoint) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

// spliceEndpoints returns merged (strictly increasing) without removed and
// with added (both sorted). Each of those is found by a binary search and
// the endpoints between them are copied in one go: what grows with the
// service is a copy, not a comparison per endpoint. It reports false when
// removed holds an endpoint merged does not, or added one that merged keeps:
// then a duplicate is involved, and the full merge decides.
func spliceEndpoints(merged, removed, added []Endpoint) ([]Endpoint, bool) {
	if len(removed) == 0 && len(added) == 0 {
		return merged, true
	}
	n := len(merged) - len(removed) + len(added)
	// Twice in one slice: the full merge keeps the better.
	if n < 0 || !strictlyIncreasing(removed) || !strictlyIncreasing(added) {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	out := make([]Endpoint, 0, n)
	next := 0 // the first endpoint of merged not yet copied or dropped
	for len(removed) > 0 || len(added) > 0 {
		// The next endpoint to add or drop; both when it is replaced.
		var key *Endpoint
		var add, drop bool
		switch {
		case len(removed) == 0:
			key, add = &added[0], true
		case len(added) == 0:
			key, drop = &removed[0], true
		default:
			c := compareEndpointKeys(&added[0], &removed[0])
			add, drop = c <= 0, c >= 0
			key = &added[0]
			if c > 0 {
				key = &removed[0]
			}
		}
		// sort.Search reads the endpoints in place; they are large.
		at := next + sort.Search(len(merged)-next, func(i int) bool { return compareEndpointKeys(&merged[next+i], key) >= 0 })
		found := at < len(merged) && compareEndpointKeys(&merged[at], key) == 0
		if found != drop {
			return nil, false // removed but not there, or added but there already
		}
		out = append(out, merged[next:at]...)
		next = at
		if drop {
			next++
			removed = removed[1:]
		}
		if add {
			out = append(out, added[0])
			added = added[1:]
		}
	}
	return append(out, merged[next:]...), true
}

func strictlyIncreasing(eps []Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if compareEndpointKeys(&eps[i-1], &eps[i]) >= 0 {
			return false
		}
	}
	return true
}
