package proxier

import (
	"net/netip"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// The affinity map holds, per client and service entry, the endpoint the
// packet path sent the client to. The ruleset can't tell a removed
// endpoint from a live one there, so the proxier deletes the elements that
// name one: after a sync that removed endpoints from a service port with
// affinity, and after every full sync (which may follow a failure).

// affinityEntry is a service entry of the affinity map's keys: an address,
// protocol and port, or for a NodePort the protocol and port alone (any
// local address).
type affinityEntry struct {
	addr        netip.Addr // invalid for a NodePort
	proto, port uint32
}

// entryOf is the entry of a dispatch key: address . protocol . port, or
// protocol . port.
func entryOf(key []m.Value) affinityEntry {
	if len(key) == 2 {
		return affinityEntry{proto: key[0].Num, port: key[1].Num}
	}
	return affinityEntry{addr: key[0].Addr, proto: key[1].Num, port: key[2].Num}
}

// affinityPrune says which elements of the affinity map a sync made stale.
type affinityPrune struct {
	// full: an element stays only when its endpoint is in targets under its
	// entry; otherwise an element goes when its endpoint is in targets
	// (the removed ones) under its entry.
	full    bool
	targets map[affinityEntry]map[netip.AddrPort]bool
}

// note records the endpoints of runs under their entries.
func (a *affinityPrune) note(runs []slotRun) {
	for _, r := range runs {
		e := entryOf(r.key)
		for i := range r.eps.len() {
			if a.targets[e] == nil {
				a.targets[e] = map[netip.AddrPort]bool{}
			}
			a.targets[e][r.eps.addrPort(i)] = true
		}
	}
}

// keep tells whether an element (client . address . protocol . port :
// endpoint address . port) stays.
func (a *affinityPrune) keep(el m.Element) bool {
	if len(el.Key) != 4 || len(el.Data) != 2 {
		return false
	}
	target := netip.AddrPortFrom(el.Data[0].Addr, uint16(el.Data[1].Num))
	vip := affinityEntry{addr: el.Key[1].Addr, proto: el.Key[2].Num, port: el.Key[3].Num}
	nodePort := affinityEntry{proto: el.Key[2].Num, port: el.Key[3].Num}
	if !a.full {
		return !a.targets[vip][target] && !a.targets[nodePort][target]
	}
	if live, ok := a.targets[vip]; ok {
		return live[target]
	}
	return a.targets[nodePort][target]
}

// newLiveAffinity starts the prune of a full sync: the endpoints every
// entry with affinity may send to, as live adds each piece's.
func newLiveAffinity() *affinityPrune {
	return &affinityPrune{full: true, targets: map[affinityEntry]map[netip.AddrPort]bool{}}
}

// live adds the endpoints p's entries with affinity may send to.
func (a *affinityPrune) live(p *piece) {
	if p.affinity {
		a.note(p.runs)
	}
}

// removedAffinity adds to a the endpoints that the version after (nil:
// none) of a service port no longer sends to under an entry where the
// version before had affinity; a is created when needed. Slots are history,
// so the runs of one key differ in a few slots: only those are compared
// (an endpoint moved to another slot is in both lists of differences).
func removedAffinity(a *affinityPrune, before, after *piece) *affinityPrune {
	if before == nil || !before.affinity {
		return a
	}
	type runKey struct {
		entry  affinityEntry
		offset uint32
	}
	afterRuns := map[runKey]slotList{}
	// inAfter tells whether an endpoint that left a slot of entry e is in
	// any slot of e after (a few are asked, each a walk).
	inAfter := func(e affinityEntry, ep netip.AddrPort) bool {
		for k, eps := range afterRuns {
			if k.entry != e {
				continue
			}
			for i := range eps.len() {
				if eps.addrPort(i) == ep {
					return true
				}
			}
		}
		return false
	}
	if after != nil && after.affinity {
		for _, r := range after.runs {
			afterRuns[runKey{entryOf(r.key), r.offset}] = r.eps
		}
	}
	// Per entry: what left a slot, and what took one.
	out, in := map[affinityEntry][]netip.AddrPort{}, map[affinityEntry]map[netip.AddrPort]bool{}
	for _, r := range before.runs {
		e := entryOf(r.key)
		next := afterRuns[runKey{e, r.offset}]
		for i := range max(r.eps.len(), next.len()) {
			switch {
			case i < r.eps.len() && i < next.len() && r.eps.addrPort(i) == next.addrPort(i):
				continue
			case i < r.eps.len():
				out[e] = append(out[e], r.eps.addrPort(i))
			}
			if i < next.len() {
				if in[e] == nil {
					in[e] = map[netip.AddrPort]bool{}
				}
				in[e][next.addrPort(i)] = true
			}
		}
	}
	for e, eps := range out {
		for _, ep := range eps {
			if in[e][ep] || inAfter(e, ep) {
				continue
			}
			if a == nil {
				a = &affinityPrune{targets: map[affinityEntry]map[netip.AddrPort]bool{}}
			}
			if a.targets[e] == nil {
				a.targets[e] = map[netip.AddrPort]bool{}
			}
			a.targets[e][ep] = true
		}
	}
	return a
}
