// A wide service port's piece patched by the tracker's endpoint delta.

package proxier

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// slotTable is the slot order of a wide port's endpoint list that endpoint
// deltas patch in place: the endpoint in each slot and each one's slot.
type slotTable struct {
	keys []netip.AddrPort
	at   map[netip.AddrPort]int32
}

func newSlotTable(l slotList) *slotTable {
	t := &slotTable{keys: make([]netip.AddrPort, l.len())}
	for i := range t.keys {
		t.keys[i] = l.addrPort(i)
	}
	t.index()
	return t
}

// index makes the slot of each key.
func (t *slotTable) index() {
	t.at = make(map[netip.AddrPort]int32, len(t.keys))
	for i, k := range t.keys {
		t.at[k] = int32(i)
	}
}

// wideLists is what a delta patches of a wide port, besides its piece: both
// endpoint lists in slot order, the counts the endpoint choice depends on,
// and per address the endpoints of the lists that make it a hairpin address.
type wideLists struct {
	tabs    [2]*slotTable // cluster-wide, local
	counts  choiceCounts
	hairpin map[netip.Addr]int
}

// choiceCounts are the counts, among the endpoints of the family, that
// decide how chooseEndpoints picks: with no hints, a list is its ready
// endpoints when it has some, its serving terminating ones otherwise.
type choiceCounts struct{ ready, readyLocal, hinted int }

// lists tells, for counts, which endpoints each list holds.
func (c choiceCounts) lists(cmp *compiler) [2]func(*k8s.Endpoint) bool {
	inFamily := func(e *k8s.Endpoint) bool { return cmp.cfg.addrInFamily(e.Addr) }
	isLocal := func(e *k8s.Endpoint) bool { return cmp.node.Name != "" && e.NodeName == cmp.node.Name }
	usable := func(e *k8s.Endpoint, ready bool) bool {
		if ready {
			return e.Ready
		}
		return !e.Ready && e.Serving && e.Terminating
	}
	return [2]func(*k8s.Endpoint) bool{
		func(e *k8s.Endpoint) bool { return inFamily(e) && usable(e, c.ready > 0) },
		func(e *k8s.Endpoint) bool { return inFamily(e) && isLocal(e) && usable(e, c.readyLocal > 0) },
	}
}

// add counts eps in (sign 1) or out (sign -1).
func (c *choiceCounts) add(cmp *compiler, eps []k8s.Endpoint, sign int) {
	for i := range eps {
		e := &eps[i]
		if !cmp.cfg.addrInFamily(e.Addr) {
			continue
		}
		if e.Ready {
			c.ready += sign
			if cmp.node.Name != "" && e.NodeName == cmp.node.Name {
				c.readyLocal += sign
			}
		}
		if e.Hints != nil {
			c.hinted += sign
		}
	}
}

// sameChoice tells whether both counts pick endpoints the same way, the
// plain way: without topology hints.
func (c choiceCounts) sameChoice(o choiceCounts) bool {
	return c.hinted == 0 && o.hinted == 0 && (c.ready > 0) == (o.ready > 0) && (c.readyLocal > 0) == (o.readyLocal > 0)
}

// newWideLists makes the patchable lists of kept, the piece of sp; nil when
// its endpoints are not picked the plain way (or the piece does not hold
// what they make, which would be a bug).
func (s *incremental) newWideLists(sp *k8s.ServicePort, p *piece) *wideLists {
	w := &wideLists{}
	w.counts.add(s.c, sp.Endpoints, 1)
	if w.counts.hinted > 0 {
		return nil
	}
	in := w.counts.lists(s.c)
	w.hairpin = make(map[netip.Addr]int, len(sp.Endpoints))
	for i, local := range []bool{false, true} {
		j := slices.IndexFunc(p.slotOrders, func(o slotOrder) bool { return o.key == slotsKey{sp.Name, local} })
		if j >= 0 {
			w.tabs[i] = newSlotTable(p.slotOrders[j].order)
			continue
		}
		// Not ordered by the piece (empty, or not used): the sorted order.
		w.tabs[i] = &slotTable{}
		for k := range sp.Endpoints {
			if e := &sp.Endpoints[k]; in[i](e) {
				w.tabs[i].keys = append(w.tabs[i].keys, addrPort(e))
			}
		}
		w.tabs[i].index()
	}
	n := [2]int{}
	for k := range sp.Endpoints {
		e := &sp.Endpoints[k]
		c, l := in[0](e), in[1](e)
		n[0], n[1] = n[0]+boolInt(c), n[1]+boolInt(l)
		if (c || l) && s.c.here(e) {
			w.hairpin[e.Addr]++
		}
	}
	if n[0] != len(w.tabs[0].keys) || n[1] != len(w.tabs[1].keys) {
		return nil
	}
	return w
}

// slotPlan is how one list's slots change: the slots whose element goes
// (its old endpoint), and the slots given an endpoint, as nextSlots would
// give them: those that stay keep their slot while it exists, and the freed
// slots are filled by those beyond the new length, then by the new ones in
// their sorted order.
type slotPlan struct {
	t       *slotTable
	out     []netip.AddrPort
	dels    []int
	fill    []int
	fillKey []netip.AddrPort
	newLen  int
}

// planSlots plans list t's change by the endpoints out (in it) and in
// (sorted, not in it); false when t does not hold what out names.
func planSlots(t *slotTable, out, in []netip.AddrPort) (slotPlan, bool) {
	oldLen := len(t.keys)
	p := slotPlan{t: t, out: out, newLen: oldLen - len(out) + len(in)}
	freed := make(map[int]bool, len(out))
	for _, k := range out {
		slot, ok := t.at[k]
		if !ok || freed[int(slot)] {
			return slotPlan{}, false
		}
		freed[int(slot)] = true
		p.dels = append(p.dels, int(slot))
	}
	var movers []netip.AddrPort
	for slot := p.newLen; slot < oldLen; slot++ {
		if !freed[slot] {
			movers = append(movers, t.keys[slot])
			p.dels = append(p.dels, slot)
		}
	}
	movers = append(movers, in...)
	for _, slot := range p.dels {
		if slot < p.newLen && freed[slot] {
			p.fill = append(p.fill, slot)
		}
	}
	slices.Sort(p.fill)
	for slot := oldLen; slot < p.newLen; slot++ {
		p.fill = append(p.fill, slot)
	}
	if len(p.fill) != len(movers) {
		return slotPlan{}, false
	}
	p.fillKey = movers
	return p, true
}

// apply changes the table as planned.
func (p *slotPlan) apply() {
	t := p.t
	for _, k := range p.out {
		delete(t.at, k)
	}
	if n := p.newLen - len(t.keys); n > 0 {
		t.keys = append(t.keys, make([]netip.AddrPort, n)...)
	}
	for i, slot := range p.fill {
		t.keys[slot] = p.fillKey[i]
		t.at[p.fillKey[i]] = int32(slot)
	}
	clear(t.keys[p.newLen:])
	t.keys = t.keys[:p.newLen]
}

// listChanges returns what leaves a list (members of it by was among
// removed) and what comes (members by is among added, sorted), an endpoint
// in both that stays a member being neither.
func listChanges(removed, added []k8s.Endpoint, was, is func(*k8s.Endpoint) bool) (out, in []netip.AddrPort) {
	for len(removed) > 0 || len(added) > 0 {
		c := walkOrder(len(removed), len(added), func() int { return addrPort(&removed[0]).Compare(addrPort(&added[0])) })
		switch {
		case c < 0:
			if was(&removed[0]) {
				out = append(out, addrPort(&removed[0]))
			}
			removed = removed[1:]
		case c > 0:
			if is(&added[0]) {
				in = append(in, addrPort(&added[0]))
			}
			added = added[1:]
		default:
			w, i := was(&removed[0]), is(&added[0])
			if w && !i {
				out = append(out, addrPort(&removed[0]))
			}
			if i && !w {
				in = append(in, addrPort(&added[0]))
			}
			removed, added = removed[1:], added[1:]
		}
	}
	return out, in
}

// patch brings the wide port of pc, whose applied piece is kept, along the
// endpoint delta pc.delta, at the cost of the endpoints that changed: the
// lists are patched, the piece is built from them without choosing
// endpoints, and only the slots that changed are sent. It reports false,
// having changed nothing, when the change needs a compile: the port's
// fields changed, it has affinity, or its endpoints are not picked the
// plain way before or after.
func (s *incremental) patch(d *delta, pc portChange) bool {
	kept, ok := s.wide[pc.old.Name]
	if !ok || kept.sp != pc.old || pc.delta == nil || pc.old.AffinityTimeout > 0 ||
		!sameServiceFields(pc.old, pc.new) || !s.c.hasFamilyAddress(pc.new) {
		return false
	}
	w := kept.w
	if w == nil {
		if w = s.newWideLists(pc.old, kept.p); w == nil {
			return false
		}
	}
	counts := w.counts
	counts.add(s.c, pc.delta.Removed, -1)
	counts.add(s.c, pc.delta.Added, 1)
	if !counts.sameChoice(w.counts) {
		return false
	}
	was, is := w.counts.lists(s.c), counts.lists(s.c)
	var plans [2]slotPlan
	for i := range plans {
		out, in := listChanges(pc.delta.Removed, pc.delta.Added, was[i], is[i])
		if plans[i], ok = planSlots(w.tabs[i], out, in); !ok {
			return false
		}
	}
	// Decided: from here on the state moves.
	w.counts = counts
	before := kept.p
	pre := [2]slotList{}
	for i := range pre {
		pre[i] = slotList{tab: w.tabs[i], n: plans[i].newLen}
		if plans[i].newLen == 0 {
			pre[i] = slotList{}
		}
	}
	after := s.c.build(pc.new, &pre)
	planOf := func(r slotRun) *slotPlan {
		for i := range plans {
			if r.eps.tab == plans[i].t {
				return &plans[i]
			}
		}
		return nil
	}
	// The slots that go, read before the tables change; those that come,
	// after.
	matched := matchRuns(before.runs, after.runs)
	for i, o := range before.runs {
		n := matched[i]
		if n < 0 {
			d.del[o.set] = o.appendElements(d.del[o.set])
			continue
		}
		for _, slot := range planOf(after.runs[n]).dels {
			d.del[o.set] = append(d.del[o.set], o.element(slot, make([]m.Value, len(o.key)+1), make([]m.Value, 2)))
		}
	}
	for i := range plans {
		plans[i].apply()
	}
	isMatched := make([]bool, len(after.runs))
	for _, n := range matched {
		if n >= 0 {
			isMatched[n] = true
		}
	}
	for i, r := range after.runs {
		if !isMatched[i] {
			d.add[r.set] = r.appendElements(d.add[r.set])
			continue
		}
		for _, slot := range planOf(r).fill {
			d.add[r.set] = append(d.add[r.set], r.element(slot, make([]m.Value, len(r.key)+1), make([]m.Value, 2)))
		}
	}
	for _, r := range before.runs {
		s.counts[r.set] -= r.eps.len()
	}
	for _, r := range after.runs {
		s.counts[r.set] += r.eps.len()
	}
	// The rest as any change, with the hairpin addresses that came and
	// went in place of the lists.
	hpOut, hpIn := w.patchHairpin(s.c, pc.delta, was, is)
	d.replace(&piece{elements: before.elements, hairpin: hpOut, clusterIPs: before.clusterIPs, uses: before.uses},
		&piece{elements: after.elements, hairpin: hpIn, clusterIPs: after.clusterIPs, uses: after.uses})
	s.noteSlots(before, after)
	if len(pc.new.Endpoints) >= keptFromEndpoints {
		s.wide[pc.new.Name] = compiledPiece{sp: pc.new, p: after, w: w}
	} else {
		delete(s.wide, pc.new.Name)
	}
	return true
}

// patchHairpin counts the delta's endpoints out of and into the hairpin
// addresses and returns the addresses that went and came, sorted.
func (w *wideLists) patchHairpin(c *compiler, dl *k8s.EndpointDelta, was, is [2]func(*k8s.Endpoint) bool) (out, in []netip.Addr) {
	change := map[netip.Addr]int{}
	for i := range dl.Removed {
		if e := &dl.Removed[i]; (was[0](e) || was[1](e)) && c.here(e) {
			change[e.Addr]--
		}
	}
	for i := range dl.Added {
		if e := &dl.Added[i]; (is[0](e) || is[1](e)) && c.here(e) {
			change[e.Addr]++
		}
	}
	for a, n := range change {
		before := w.hairpin[a]
		after := before + n
		switch {
		case n == 0:
			continue
		case after == 0:
			delete(w.hairpin, a)
			out = append(out, a)
		default:
			w.hairpin[a] = after
			if before == 0 {
				in = append(in, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	slices.SortFunc(in, netip.Addr.Compare)
	return out, in
}
