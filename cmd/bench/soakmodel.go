package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The soak's churn, as a rolling update replaces pods: a new pod comes up
// (its address answers) and joins its service's EndpointSlice as ready in
// the same write that marks an old endpoint terminating; a grace period
// later the old pod exits (its address stops answering) and its endpoint is
// removed. Every service keeps its ready endpoints throughout, so a proxy
// that never sends a new connection to a terminating endpoint while ready
// ones exist, and applies each write within the grace period, fails no
// connection.

// soakModel is the churned API state: every service's endpoints (the
// services' names and ClusterIPs are the workload's, which never change),
// the pods at their addresses, and the pool of pod addresses not in use.
// One goroutine owns it.
type soakModel struct {
	endpointsOf [][]soakEndpoint // by service
	owners      *addrOwners      // a pod runs at every endpoint's address
	free        []netip.Addr     // FIFO: a freed address comes back last, long after its rules are gone
	rng         *rand.Rand
	// terminating counts the endpoints that are terminating: what the
	// churn adds to the steady endpoints, the grace period (and any lag
	// of the writes) times the rate. The samples read it as the churn runs.
	terminating atomic.Int64
	// replaced counts the replacements so far: the churn keeps its rate
	// with it, and the samples read it.
	replaced atomic.Int64
}

type soakEndpoint struct {
	addr        netip.Addr
	terminating bool
}

// newSoakModel starts from the workload's services, every endpoint ready;
// the pool is every address of pool the workload does not use.
func newSoakModel(w *workload, pool netip.Prefix, seed uint64) *soakModel {
	m := &soakModel{owners: &addrOwners{}, rng: rand.New(rand.NewPCG(seed, seed))}
	for i, s := range w.services {
		var eps []soakEndpoint
		for _, a := range s.endpoints {
			eps = append(eps, soakEndpoint{addr: a})
			m.owners.set(a, i)
		}
		m.endpointsOf = append(m.endpointsOf, eps)
	}
	for a := pool.Addr(); pool.Contains(a); a = a.Next() {
		if _, used := m.owners.get(a); !used {
			m.free = append(m.free, a)
		}
	}
	return m
}

// soakChange is one slice write of the churn in service svc: a replacement,
// where added joins as ready and retiring becomes terminating, or the
// removal of a terminating endpoint.
type soakChange struct {
	svc                      int
	added, retiring, removed netip.Addr
}

// replace starts replacing a random ready endpoint of a random service: the
// new pod starts, and its endpoint joins. ok is false when the pool is empty
// or the service has no ready endpoint.
func (m *soakModel) replace() (r soakChange, ok bool) {
	if len(m.free) == 0 {
		return r, false
	}
	r.svc = m.rng.IntN(len(m.endpointsOf))
	eps := m.endpointsOf[r.svc]
	var ready []int
	for i, e := range eps {
		if !e.terminating {
			ready = append(ready, i)
		}
	}
	if len(ready) == 0 {
		return r, false
	}
	old := &eps[ready[m.rng.IntN(len(ready))]]
	old.terminating = true
	m.terminating.Add(1)
	m.replaced.Add(1)
	r.retiring, r.added = old.addr, m.free[0]
	m.free = m.free[1:]
	m.owners.set(r.added, r.svc)
	m.endpointsOf[r.svc] = append(eps, soakEndpoint{addr: r.added})
	return r, true
}

// remove stops the pod of a terminating endpoint, then takes the endpoint
// out of its service and gives its address back to the pool.
func (m *soakModel) remove(svc int, addr netip.Addr) {
	m.owners.set(addr, -1)
	m.endpointsOf[svc] = slices.DeleteFunc(m.endpointsOf[svc], func(e soakEndpoint) bool {
		if e.addr == addr && e.terminating {
			m.terminating.Add(-1)
		}
		return e.addr == addr
	})
	m.free = append(m.free, addr)
}

// endpoints returns a copy of the service's endpoints, for a writer that
// runs while the model moves on.
func (m *soakModel) endpoints(svc int) []soakEndpoint {
	return slices.Clone(m.endpointsOf[svc])
}

// addrOwners says which service each address belongs to while its pod
// runs: what the pods' servers answer and what clients check. Safe for
// concurrent use.
type addrOwners struct{ m sync.Map } // netip.Addr to service index

// set starts the pod at a for service svc, or stops it for svc -1.
func (o *addrOwners) set(a netip.Addr, svc int) {
	if svc < 0 {
		o.m.Delete(a)
	} else {
		o.m.Store(a, svc)
	}
}

// get returns the service of the pod at a; ok is false when none runs there.
func (o *addrOwners) get(a netip.Addr) (svc int, ok bool) {
	v, ok := o.m.Load(a)
	svc, _ = v.(int)
	return svc, ok
}

// recentRing remembers the services changed last, for clients that aim at
// services in the middle of a change. Safe for concurrent use.
type recentRing struct {
	slots []atomic.Int32
	next  atomic.Uint64 // every push so far
}

func newRecentRing(n int) *recentRing { return &recentRing{slots: make([]atomic.Int32, n)} }

func (r *recentRing) push(svc int) {
	i := r.next.Add(1) - 1
	r.slots[i%uint64(len(r.slots))].Store(int32(svc + 1))
}

// pick returns a recently changed service; ok is false before any change.
func (r *recentRing) pick(rng *rand.Rand) (int, bool) {
	n := min(r.next.Load(), uint64(len(r.slots)))
	if n == 0 {
		return 0, false
	}
	v := r.slots[rng.IntN(int(n))].Load()
	return int(v) - 1, v != 0
}

// eventLog keeps what goroutines record, in order, for the samples and the
// report. Safe for concurrent use.
type eventLog[T any] struct {
	mu  sync.Mutex
	all []T
}

func (l *eventLog[T]) add(v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, v)
}

// since returns a copy of what was recorded after the first from.
func (l *eventLog[T]) since(from int) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all[min(from, len(l.all)):])
}

// What a change does to its added, retiring and removed address.
var changeNames = []string{"added as ready", "made terminating", "pod exited, removal"}

// describe returns what the writes did to the address, a write a line, in
// the order they were queued (the lines start with the time).
func describe(writes []soakWrite, a netip.Addr) []string {
	var out []string
	for _, w := range writes {
		for i, b := range []netip.Addr{w.added, w.retiring, w.removed} {
			if b != a {
				continue
			}
			done := "written " + stamp(w.written)
			if w.err != nil {
				done = "failed: " + w.err.Error()
			}
			out = append(out, fmt.Sprintf("%s %s svc %d: %s queued, %s", stamp(w.queued), a, w.svc, changeNames[i], done))
		}
	}
	slices.Sort(out)
	return out
}

// stamp is the time of day of a failure or a change, for the report.
func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }
