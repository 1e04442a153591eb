package k8s

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Changes is what the tracker hands over to a delta sync: the service ports
// that changed since the last hand-over, with the node and the service
// CIDRs (whose changes make the sync full). It costs what changed: nothing
// in it walks the unchanged services.
type Changes struct {
	// Ports holds the current version of each service port that may have
	// changed; nil when it is gone (deleted, or left out for a conflict).
	// A port can be listed although it is as the receiver last saw it.
	Ports        map[ServicePortName]*ServicePort
	Node         Node
	ServiceCIDRs []netip.Prefix
	// TriggerTimes are the last-change-trigger-time annotations of the
	// endpoint changes handed over, for kube-proxy's network programming
	// latency.
	TriggerTimes []TriggerTime
	// Deltas say, for some of the ports whose endpoints changed, which
	// endpoints left and came: a receiver may patch what it built from the
	// old list instead of walking the new one.
	Deltas map[ServicePortName]*EndpointDelta
}

// EndpointDelta is how a service port's endpoints went from one list to the
// next by a slice's change: the endpoints that left and those that came
// (one changed in place is in both), each sorted by address and port. From
// and To are the two lists, compared by identity (lists are never modified
// in place), so that a receiver can tell in constant time whether the delta
// leads from the list it holds to the one it is given.
type EndpointDelta struct {
	From, To       []Endpoint
	Removed, Added []Endpoint
}

// Leads tells whether d takes list from to list to.
func (d *EndpointDelta) Leads(from, to []Endpoint) bool {
	same := func(a, b []Endpoint) bool { return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0] }
	return same(d.From, from) && same(d.To, to)
}

// TriggerTime is when the controller saw the change that an EndpointSlice
// carries (its endpoints.kubernetes.io/last-change-trigger-time), and the
// family of the slice's addresses.
type TriggerTime struct {
	Time time.Time
	IPv6 bool
}

// TakeChanges hands over the service ports that changed since the last call,
// and forgets them. A full sync calls it before Snapshot, so that the
// snapshot holds at least what was handed over. The ports point into the
// tracker's state, which is never modified in place: neither the tracker nor
// the caller may modify them.
func (t *Tracker) TakeChanges() Changes {
	t.mu.Lock()
	problems := t.checkConflicts()
	t.stats.Invalid += uint64(len(problems))
	ch := Changes{Ports: make(map[ServicePortName]*ServicePort, len(t.dirty)), Node: t.currentNode(),
		ServiceCIDRs: t.allServiceCIDRs()}
	for name := range t.dirty {
		ch.Ports[name] = t.current(name)
	}
	if len(t.deltas) > 0 {
		ch.Deltas = t.deltas
	}
	for _, times := range t.triggers {
		ch.TriggerTimes = append(ch.TriggerTimes, times...)
	}
	slices.SortFunc(ch.TriggerTimes, func(a, b TriggerTime) int { return a.Time.Compare(b.Time) })
	if len(t.triggers) > 0 {
		t.triggers = map[types.NamespacedName][]TriggerTime{}
	}
	t.taken = t.stats
	// A new map: clearing one costs its capacity, which a start or a
	// manifest reload made as large as the number of services.
	t.dirty = map[ServicePortName]struct{}{}
	t.forgetSplices()
	t.mu.Unlock()
	t.report(problems)
	return ch
}

// current returns the merged version of a service port; nil when there is
// none or it is left out for a conflict.
func (t *Tracker) current(name ServicePortName) *ServicePort {
	key := keyOf(name.Namespace, name.Name)
	if t.services[key] == nil || t.skip[name] {
		return nil
	}
	m := t.mergedOf(key)
	if i := slices.IndexFunc(m, func(sp ServicePort) bool { return sp.Name == name }); i >= 0 {
		return &m[i]
	}
	return nil
}
