// A full ruleset assembled from the pieces of every service port, its sets sized.

package proxier

import (
	"maps"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// assembly gathers a full ruleset out of the pieces of every service port,
// in service order, one piece at a time: what the ruleset is made of is
// kept, the rest of each piece is garbage at once, so that a full sync never
// holds every piece (at 100,000 services they were 73 MB of its peak). The
// endpoint maps, the hairpin and the cluster-IP sets get sources
// (m.Set.Source) that make their elements while a full apply encodes its
// batch: they are most of a table's elements, and held as a model they were
// most of the first sync's peak. m.Materialized holds them.
type assembly struct {
	c          *compiler
	elements   map[*m.Set][]m.Element
	runs       map[*m.Set][]slotRun
	hairpin    []netip.Addr
	clusterIPs []netip.Addr
	used       map[sharedObj]bool
}

// newAssembly starts a ruleset, its lists sized from the snapshot's hint
// so that they are allocated once.
func (c *compiler) newAssembly(hint sizeHint) *assembly {
	return &assembly{
		c:        c,
		elements: map[*m.Set][]m.Element{c.serviceIPs: make([]m.Element, 0, hint.ports)},
		// The endpoint maps always have a source, with or without runs.
		runs: map[*m.Set][]slotRun{c.endpoints: make([]slotRun, 0, hint.ports), c.nodePortEndpoints: nil,
			c.wideEndpoints: nil, c.wideNodePortEndpoints: nil},
		hairpin:    make([]netip.Addr, 0, hint.endpoints),
		clusterIPs: make([]netip.Addr, 0, hint.clusterIPs),
		used:       map[sharedObj]bool{},
	}
}

// sizeHint is what the pieces of snap hold at most, summed: the service
// ports with an address of the family, their ClusterIPs and their
// endpoints of the family.
type sizeHint struct{ ports, clusterIPs, endpoints int }

func (c *compiler) sizeHint(snap *k8s.Snapshot) sizeHint {
	var h sizeHint
	for i := range snap.Services {
		sp := &snap.Services[i]
		if !c.hasFamilyAddress(sp) {
			continue
		}
		h.ports++
		for _, ip := range sp.ClusterIPs {
			if c.cfg.addrInFamily(ip) {
				h.clusterIPs++
			}
		}
		for j := range sp.Endpoints {
			if c.cfg.addrInFamily(sp.Endpoints[j].Addr) {
				h.endpoints++
			}
		}
	}
	return h
}

// add takes what the ruleset needs of one piece.
func (a *assembly) add(p *piece) {
	for _, ke := range p.elements {
		a.elements[ke.set] = append(a.elements[ke.set], ke.el)
	}
	for _, r := range p.runs {
		a.runs[r.set] = append(a.runs[r.set], r)
	}
	a.hairpin = append(a.hairpin, p.hairpin...)
	a.clusterIPs = append(a.clusterIPs, p.clusterIPs...)
	for _, o := range p.uses {
		a.used[o] = true
	}
}

// ruleset is the ruleset of the pieces added.
func (a *assembly) ruleset() *m.Ruleset {
	c := a.c
	sources := map[*m.Set]m.ElementSource{
		c.hairpin:    addrSource{addrs: sortedAddrs(a.hairpin), parts: 2},
		c.clusterIPs: addrSource{addrs: sortedAddrs(a.clusterIPs), parts: 1},
	}
	for set, rs := range a.runs {
		sources[set] = newRunSource(a.elements[set], rs)
	}
	objs := slices.SortedFunc(maps.Keys(a.used), compareShared)

	rs := &m.Ruleset{Family: c.cfg.Family, Table: TableName}
	withElements := func(decl *m.Set) *m.Set {
		s := *decl
		if src := sources[decl]; src != nil {
			s.Source = src
		} else {
			s.Elements = a.elements[decl]
		}
		if size := declaredSize(decl, s.Len()); size > 0 {
			s.Size = size
		}
		return &s
	}
	for _, s := range c.fixedSets() {
		rs.Sets = append(rs.Sets, withElements(s))
	}
	rs.Chains = append(c.baseChains(), c.fixedChains()...)
	for _, o := range objs {
		rs.Chains = append(rs.Chains, c.sharedChain(o))
	}
	return rs
}

// assemble builds the ruleset of every service port of snap.
func (c *compiler) assemble(snap *k8s.Snapshot) *m.Ruleset {
	a := c.newAssembly(c.sizeHint(snap))
	for i := range snap.Services {
		a.add(c.piece(&snap.Services[i]))
	}
	return a.ruleset()
}

// sizedFrom is the element count from which a set is declared with a size:
// the kernel then fills a hash table of fixed size, not one it resizes as
// it goes, which takes a third less of its time for a full sync (10,000
// services of 3 endpoints: 107 -> 67 ms, BenchmarkKernelSync), and a
// quarter less at 1,000 services, whose sets of a few thousand elements
// were below the first threshold of 4,096. A smaller set keeps the
// resizable table, which costs no memory it doesn't use: sizing sets from
// 64 elements on gained nothing more.
var sizedFrom = 512

// declaredSize is the size a set of n elements is declared with: none below
// sizedFrom, else the power of two from 2n, so that it can double before a
// sync must declare it again (see incremental.fits). A set with a timeout
// keeps the size of its own declaration, and an interval set (the kernel's
// pipapo) has none.
func declaredSize(decl *m.Set, n int) uint32 {
	if decl.Timeout > 0 || decl.Interval || n < sizedFrom {
		return 0
	}
	return 1 << bits.Len(uint(2*n-1))
}

// sortedAddrs sorts addrs in place and drops the duplicates.
func sortedAddrs(addrs []netip.Addr) []netip.Addr {
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}
