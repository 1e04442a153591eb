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

// soakModel is the churned API state: every service's endpoints and the pool
// of pod addresses not in use. One goroutine owns it.
type soakModel struct {
	services []soakService
	free     []netip.Addr // FIFO: a freed address comes back last, long after its rules are gone
	rng      *rand.Rand
	// terminating counts the endpoints that are terminating: what the
	// churn adds to the steady endpoints, the grace period (and any lag
	// of the writes) times the rate.
	terminating int
}

type soakService struct {
	name      string
	clusterIP netip.Addr
	endpoints []soakEndpoint
}

type soakEndpoint struct {
	addr        netip.Addr
	terminating bool
}

// newSoakModel starts from the workload's services, every endpoint ready;
// the pool is every address of pool the workload does not use.
func newSoakModel(w *workload, pool netip.Prefix, seed uint64) *soakModel {
	m := &soakModel{rng: rand.New(rand.NewPCG(seed, seed))}
	used := map[netip.Addr]bool{}
	for _, s := range w.services {
		ss := soakService{name: s.name, clusterIP: s.clusterIP}
		for _, a := range s.endpoints {
			ss.endpoints = append(ss.endpoints, soakEndpoint{addr: a})
			used[a] = true
		}
		m.services = append(m.services, ss)
	}
	for a := pool.Addr(); pool.Contains(a); a = a.Next() {
		if !used[a] {
			m.free = append(m.free, a)
		}
	}
	return m
}

// replacement is one change: in service svc, added joins as ready and
// retiring becomes terminating.
type replacement struct {
	svc      int
	added    netip.Addr
	retiring netip.Addr
}

// replace starts replacing a random ready endpoint of a random service; ok
// is false when the pool is empty or the service has no ready endpoint.
func (m *soakModel) replace() (r replacement, ok bool) {
	if len(m.free) == 0 {
		return r, false
	}
	r.svc = m.rng.IntN(len(m.services))
	s := &m.services[r.svc]
	var ready []int
	for i, e := range s.endpoints {
		if !e.terminating {
			ready = append(ready, i)
		}
	}
	if len(ready) == 0 {
		return r, false
	}
	old := &s.endpoints[ready[m.rng.IntN(len(ready))]]
	old.terminating = true
	m.terminating++
	r.retiring, r.added = old.addr, m.free[0]
	m.free = m.free[1:]
	s.endpoints = append(s.endpoints, soakEndpoint{addr: r.added})
	return r, true
}

// remove takes a terminating endpoint out of its service and gives its
// address back to the pool.
func (m *soakModel) remove(svc int, addr netip.Addr) {
	s := &m.services[svc]
	s.endpoints = slices.DeleteFunc(s.endpoints, func(e soakEndpoint) bool {
		if e.addr == addr && e.terminating {
			m.terminating--
		}
		return e.addr == addr
	})
	m.free = append(m.free, addr)
}

// endpoints returns a copy of the service's endpoints, for a writer that
// runs while the model moves on.
func (m *soakModel) endpoints(svc int) []soakEndpoint {
	return slices.Clone(m.services[svc].endpoints)
}

// addrOwners says which service each address of the pool belongs to, while
// its pod runs: what the pods' servers answer and what clients check. Safe
// for concurrent use.
type addrOwners struct {
	pool  netip.Prefix
	owner []atomic.Int32 // service index + 1; 0: no pod has the address
}

func newAddrOwners(pool netip.Prefix) *addrOwners {
	return &addrOwners{pool: pool, owner: make([]atomic.Int32, 1<<(32-pool.Bits()))}
}

func (o *addrOwners) index(a netip.Addr) (int, bool) {
	if !a.Is4() || !o.pool.Contains(a) {
		return 0, false
	}
	b, p := a.As4(), o.pool.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	base := uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3])
	return int(v - base), true
}

// set starts the pod at a for service svc.
func (o *addrOwners) set(a netip.Addr, svc int) {
	if i, ok := o.index(a); ok {
		o.owner[i].Store(int32(svc + 1))
	}
}

// clear stops the pod at a.
func (o *addrOwners) clear(a netip.Addr) {
	if i, ok := o.index(a); ok {
		o.owner[i].Store(0)
	}
}

// get returns the service of the pod at a; ok is false when none runs there.
func (o *addrOwners) get(a netip.Addr) (svc int, ok bool) {
	i, in := o.index(a)
	if !in {
		return 0, false
	}
	v := o.owner[i].Load()
	return int(v) - 1, v != 0
}

// recentRing remembers the services changed last, for clients that aim at
// services in the middle of a change. Safe for concurrent use.
type recentRing struct {
	slots []atomic.Int32
	next  atomic.Uint64
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

// What happened to an address, for the report of a connection that reached
// one with no pod.
const (
	evAddedQueued = iota
	evAddedWritten
	evRetiringQueued
	evRetiringWritten
	evPodExited // and its endpoint's removal queued
	evRemovedWritten
)

var evNames = []string{"added as ready, queued", "added as ready, written", "made terminating, queued",
	"made terminating, written", "pod exited, removal queued", "removal written"}

type addrEvent struct {
	at  time.Time
	ev  uint8
	svc int32
}

// addrHistory records what happened to each address. Safe for concurrent
// use.
type addrHistory struct {
	mu     sync.Mutex
	events map[netip.Addr][]addrEvent
}

func newAddrHistory() *addrHistory { return &addrHistory{events: map[netip.Addr][]addrEvent{}} }

func (h *addrHistory) add(a netip.Addr, ev uint8, svc int) {
	if !a.IsValid() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events[a] = append(h.events[a], addrEvent{at: time.Now(), ev: ev, svc: int32(svc)})
}

// describe returns the address's history, one event a line.
func (h *addrHistory) describe(a netip.Addr) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.events[a] {
		out = append(out, fmt.Sprintf("%s %s svc %d: %s", e.at.UTC().Format("15:04:05.000"), a, e.svc, evNames[e.ev]))
	}
	return out
}
