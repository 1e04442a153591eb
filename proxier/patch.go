// A wide service port's piece patched by the tracker's endpoint delta.

package proxier

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// slotTable is the slot order of a wide port's endpoint list that endpoint
// deltas patch in place: the endpoint in each slot, and the slots sorted by
// their endpoint, which finds an endpoint's slot by binary search. Made from
// a compiled list, the second is the inverse of its permutation: no map,
// no sort.
type slotTable struct {
	keys  []netip.AddrPort
	bykey []int32
	spare []int32 // bykey's next version is built here
}

func newSlotTable(l slotList) *slotTable {
	n := l.len()
	t := &slotTable{keys: make([]netip.AddrPort, n), bykey: make([]int32, n)}
	for i := range t.keys {
		t.keys[i] = l.addrPort(i)
	}
	for slot := range t.bykey {
		t.bykey[slot] = int32(slot)
	}
	if l.tab == nil && l.perm != nil {
		for slot, i := range l.perm {
			t.bykey[i] = int32(slot)
		}
	}
	// The list's endpoints are sorted as the tracker hands them over; any
	// other order is sorted here.
	for i := 1; i < n; i++ {
		if t.keys[t.bykey[i-1]].Compare(t.keys[t.bykey[i]]) >= 0 {
			slices.SortFunc(t.bykey, func(a, b int32) int { return t.keys[a].Compare(t.keys[b]) })
			break
		}
	}
	return t
}

// find returns the position in bykey of k, or where it would be.
func (t *slotTable) find(k netip.AddrPort) (int, bool) {
	i := sort.Search(len(t.bykey), func(i int) bool { return t.keys[t.bykey[i]].Compare(k) >= 0 })
	return i, i < len(t.bykey) && t.keys[t.bykey[i]] == k
}

// wideLists is what a delta patches of a wide port, besides its piece: both
// endpoint lists in slot order and the counts the endpoint choice depends
// on.
type wideLists struct {
	tabs   [2]*slotTable // cluster-wide, local
	counts choiceCounts
}

// choiceCounts are the counts, among the endpoints of the family, that
// decide how chooseEndpoints picks: with no hints, a list is its ready
// endpoints when it has some, its serving terminating ones otherwise.
type choiceCounts struct{ ready, readyLocal, hinted int }

// keeps are what the two lists keep without hints (chooseEndpoints's
// choice): the endpoints of the family, and of them those on this node.
func keeps(cmp *compiler) [2]func(*k8s.Endpoint) bool {
	local := isLocal(&cmp.node)
	inFamily := func(e *k8s.Endpoint) bool { return cmp.cfg.addrInFamily(e.Addr) }
	return [2]func(*k8s.Endpoint) bool{inFamily, func(e *k8s.Endpoint) bool { return inFamily(e) && local(e) }}
}

// lists tells, for counts, which endpoints each list holds.
func (c choiceCounts) lists(cmp *compiler) [2]func(*k8s.Endpoint) bool {
	keep := keeps(cmp)
	return [2]func(*k8s.Endpoint) bool{
		func(e *k8s.Endpoint) bool { return inChoice(e, keep[0], c.ready > 0) },
		func(e *k8s.Endpoint) bool { return inChoice(e, keep[1], c.readyLocal > 0) },
	}
}

// add counts eps in (sign 1) or out (sign -1).
func (c *choiceCounts) add(cmp *compiler, eps []k8s.Endpoint, sign int) {
	keep := keeps(cmp)
	for i := range eps {
		e := &eps[i]
		if !keep[0](e) {
			continue
		}
		if e.Ready {
			c.ready += sign
			if keep[1](e) {
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
	n := [2]int{}
	for k := range sp.Endpoints {
		e := &sp.Endpoints[k]
		n[0], n[1] = n[0]+boolInt(in[0](e)), n[1]+boolInt(in[1](e))
	}
	for i, local := range []bool{false, true} {
		j := slices.IndexFunc(p.slotOrders, func(o slotOrder) bool { return o.key == slotsKey{sp.Name, local} })
		if j >= 0 {
			w.tabs[i] = newSlotTable(p.slotOrders[j].order)
		} else {
			// Not ordered by the piece (empty, or not used): the sorted order.
			l := make([]k8s.Endpoint, 0, n[i])
			for k := range sp.Endpoints {
				if e := &sp.Endpoints[k]; in[i](e) {
					l = append(l, *e)
				}
			}
			w.tabs[i] = newSlotTable(slotList{eps: l})
		}
		if n[i] != len(w.tabs[i].keys) {
			return nil
		}
	}
	return w
}

// slotPlan is how one list's slots change: the slots whose element goes
// (its old endpoint), and the slots given an endpoint, as nextSlots would
// give them: those that stay keep their slot while it exists, and the freed
// slots are filled by those beyond the new length, then by the new ones in
// their sorted order. The positions in the table's bykey of what goes,
// moves and comes are found before the table changes.
type slotPlan struct {
	t       *slotTable
	dels    []int
	fill    []int
	fillKey []netip.AddrPort
	newLen  int
	outAt   []int // bykey positions of the endpoints out, ascending
	moveAt  []int // bykey positions of the movers, in fill order
	inAt    []int // bykey positions the endpoints in go before
}

// planSlots plans list t's change by the endpoints out (in it) and in
// (sorted, not in it); false when t does not hold what out names, or holds
// one of in.
func planSlots(t *slotTable, out, in []netip.AddrPort) (slotPlan, bool) {
	oldLen := len(t.keys)
	p := slotPlan{t: t, newLen: oldLen - len(out) + len(in)}
	freed := make(map[int]bool, len(out))
	for _, k := range out {
		at, ok := t.find(k)
		if !ok || freed[int(t.bykey[at])] {
			return slotPlan{}, false
		}
		slot := int(t.bykey[at])
		freed[slot] = true
		p.dels = append(p.dels, slot)
		p.outAt = append(p.outAt, at)
	}
	slices.Sort(p.outAt)
	var movers []netip.AddrPort
	for slot := p.newLen; slot < oldLen; slot++ {
		if !freed[slot] {
			at, _ := t.find(t.keys[slot])
			movers = append(movers, t.keys[slot])
			p.moveAt = append(p.moveAt, at)
			p.dels = append(p.dels, slot)
		}
	}
	for _, k := range in {
		at, ok := t.find(k)
		if ok {
			return slotPlan{}, false
		}
		p.inAt = append(p.inAt, at)
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

// apply changes the table as planned: the keys of the filled slots, and
// bykey merged with what went and came (one copy of it, into the spare).
func (p *slotPlan) apply() {
	t := p.t
	if n := p.newLen - len(t.keys); n > 0 {
		t.keys = append(t.keys, make([]netip.AddrPort, n)...)
	}
	for i, slot := range p.fill {
		t.keys[slot] = p.fillKey[i]
	}
	for i, at := range p.moveAt {
		t.bykey[at] = int32(p.fill[i])
	}
	inSlots := p.fill[len(p.moveAt):]
	dst, src, start := t.spare[:0], t.bykey, 0
	outAt, inAt := p.outAt, p.inAt
	for len(outAt) > 0 || len(inAt) > 0 {
		// One that comes before a position goes before what goes from it.
		if len(inAt) > 0 && (len(outAt) == 0 || inAt[0] <= outAt[0]) {
			dst = append(append(dst, src[start:inAt[0]]...), int32(inSlots[0]))
			start, inAt, inSlots = inAt[0], inAt[1:], inSlots[1:]
			continue
		}
		dst = append(dst, src[start:outAt[0]]...)
		start, outAt = outAt[0]+1, outAt[1:]
	}
	t.bykey, t.spare = append(dst, src[start:]...), src
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
	hpOut, hpIn := hairpinChanges(s.c, pc.delta, was, is)
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

// hairpinChanges returns the hairpin addresses that went and came with the
// delta dl from list old (members by was) to list now (by is), sorted. Only
// the delta's addresses can change; each is looked up in both lists, which
// are sorted by address: no count per address is kept.
func hairpinChanges(c *compiler, dl *k8s.EndpointDelta, was, is [2]func(*k8s.Endpoint) bool) (out, in []netip.Addr) {
	has := func(eps []k8s.Endpoint, a netip.Addr, member [2]func(*k8s.Endpoint) bool) bool {
		i := sort.Search(len(eps), func(i int) bool { return eps[i].Addr.Compare(a) >= 0 })
		for ; i < len(eps) && eps[i].Addr == a; i++ {
			if e := &eps[i]; (member[0](e) || member[1](e)) && c.here(e) {
				return true
			}
		}
		return false
	}
	removed, added := dl.Removed, dl.Added
	var last netip.Addr
	for len(removed) > 0 || len(added) > 0 {
		var a netip.Addr
		if walkOrder(len(removed), len(added), func() int { return removed[0].Addr.Compare(added[0].Addr) }) <= 0 {
			a, removed = removed[0].Addr, removed[1:]
		} else {
			a, added = added[0].Addr, added[1:]
		}
		if a == last {
			continue
		}
		last = a
		switch before, after := has(dl.From, a, was), has(dl.To, a, is); {
		case before && !after:
			out = append(out, a)
		case after && !before:
			in = append(in, a)
		}
	}
	return out, in
}
