package proxier

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// incremental is one family's ruleset as applied, kept as the reference
// counts of what service ports share, so that a new snapshot costs a compile
// of the service ports that changed (the tracker hands them over) instead of a
// compile and a diff of everything. It holds no compiled pieces: compiling
// is deterministic, so the applied piece of a changed service port is
// compiled again from its old version, which the proxier keeps, which
// saves the memory of a whole ruleset.
type incremental struct {
	c *compiler
	// Reference counts of what service ports share.
	shared              map[sharedObj]int
	hairpin, clusterIPs map[netip.Addr]int
	// counts are the elements of each set, by declaration; sizes are the
	// sizes the sets were declared with in the kernel, those that have one.
	counts map[*m.Set]int
	sizes  map[*m.Set]uint32
	// slots is the slot assignment applied: the compiler reads it, and an
	// update moves it along.
	slots Slots
	// wide holds the applied pieces of the service ports with many
	// endpoints, with the version each was compiled from: a change to one
	// reuses the applied piece instead of compiling it again (at 5,000
	// endpoints, half the cost). Few ports are wide, so this costs little
	// of the memory the state saves by keeping no pieces.
	wide map[k8s.ServicePortName]compiledPiece
	// prune is what the last update or full compile made stale in the
	// affinity map; the proxier takes it once the kernel has the changes.
	prune *affinityPrune
}

// takePrune returns the pending prune of the affinity map (nil: none) and
// forgets it.
func (s *incremental) takePrune() *affinityPrune {
	pr := s.prune
	s.prune = nil
	return pr
}

// compiledPiece is a piece and the service port version it was compiled
// from (the proxier's, compared by identity).
type compiledPiece struct {
	sp *k8s.ServicePort
	p  *piece
	// w, once an endpoint delta patched the piece (patch.go), is what the
	// next one patches; p's hairpin list is then not whole.
	w *wideLists
}

// keptFromEndpoints is the endpoint count from which a service port's applied
// piece is kept.
var keptFromEndpoints = 64

// keep notes p as sp's applied piece when sp is wide.
func (s *incremental) keep(sp *k8s.ServicePort, p *piece) {
	if len(sp.Endpoints) >= keptFromEndpoints {
		s.wide[sp.Name] = compiledPiece{sp: sp, p: p}
	}
}

// newIncremental compiles snap in full, the endpoints in slots after the
// assignment prev (nil: Compile's ruleset; a full resync passes the last
// state's, so that it moves no endpoint).
func newIncremental(snap *k8s.Snapshot, cfg Config, prev Slots) (*incremental, *m.Ruleset) {
	s := &incremental{
		c:      newCompiler(cfg, snap),
		shared: map[sharedObj]int{},
		counts: map[*m.Set]int{},
		sizes:  map[*m.Set]uint32{},
		slots:  Slots{},
		wide:   map[k8s.ServicePortName]compiledPiece{},
	}
	s.c.slots = prev
	hint := s.c.sizeHint(snap)
	asm := s.c.newAssembly(hint)
	// Sized once from the snapshot: grown one address at a time, the two
	// maps were a full sync's largest garbage.
	s.hairpin = make(map[netip.Addr]int, hint.endpoints)
	s.clusterIPs = make(map[netip.Addr]int, hint.clusterIPs)
	s.prune = newLiveAffinity()
	// One piece at a time: counted, kept when wide, and assembled.
	for i := range snap.Services {
		p := s.c.piece(&snap.Services[i])
		s.count(p, 1)
		s.noteSlots(nil, p)
		s.keep(&snap.Services[i], p)
		s.prune.live(p)
		asm.add(p)
	}
	s.c.slots = s.slots
	// The sizes assemble declares, from the same counts.
	for decl, n := range s.counts {
		if size := declaredSize(decl, n); size > 0 {
			s.sizes[decl] = size
		}
	}
	return s, asm.ruleset()
}

// fits tells whether every set declared with a size holds no more elements
// than it: a set that outgrew its size must be declared again, which only
// a full sync does.
func (s *incremental) fits() bool {
	for decl, size := range s.sizes {
		if s.counts[decl] > int(size) {
			return false
		}
	}
	return true
}

// noteSlots replaces the slot orders of old (nil: none) with new's; a
// sorted order is kept as no entry.
func (s *incremental) noteSlots(old, new *piece) {
	if old != nil {
		for _, o := range old.slotOrders {
			delete(s.slots, o.key)
		}
	}
	for _, o := range new.slotOrders {
		if !o.sorted() {
			s.slots[o.key] = o.order
		}
	}
}

// spellSlots writes p's sorted orders into the assignment, so that the next
// version of its service port starts from them rather than from its own
// sorted order.
func (s *incremental) spellSlots(p *piece) {
	for _, o := range p.slotOrders {
		if o.sorted() {
			s.slots[o.key] = o.order
		}
	}
}

// count adds a piece's references (delta 1) or removes them (delta -1).
// An address no piece refers to any more is forgotten.
func (s *incremental) count(p *piece, delta int) {
	for _, o := range p.uses {
		s.shared[o] += delta
	}
	// An address is one element of its set, however many pieces use it.
	addrs := func(set *m.Set, refs map[netip.Addr]int, list []netip.Addr) {
		for _, a := range list {
			n := refs[a] + delta
			switch {
			case n == 0:
				delete(refs, a)
				s.counts[set]--
			case n == 1 && delta > 0:
				s.counts[set]++
			}
			if n != 0 {
				refs[a] = n
			}
		}
	}
	addrs(s.c.hairpin, s.hairpin, p.hairpin)
	addrs(s.c.clusterIPs, s.clusterIPs, p.clusterIPs)
	for _, ke := range p.elements {
		s.counts[ke.set] += delta
	}
	for _, r := range p.runs {
		s.counts[r.set] += delta * r.eps.len()
	}
}

// elements is the number of set elements of the ruleset.
func (s *incremental) elements() int {
	n := 0
	for _, c := range s.counts {
		n += c
	}
	return n
}

// ruleset assembles the whole ruleset of snap, the snapshot of the last
// update, as Compile would.
func (s *incremental) ruleset(snap *k8s.Snapshot) *m.Ruleset {
	return s.c.assemble(snap)
}

// update brings the state from the last sync to the node, service CIDRs and
// service ports given (the ports that differ from the last sync), and returns the changes that bring the
// kernel along. It reports false when snap can't be reached incrementally
// (the node or the service CIDRs changed); the state is then spoiled and
// the caller must start over with a full sync.
func (s *incremental) update(node k8s.Node, serviceCIDRs []netip.Prefix, ports []portChange) (m.Changes, bool) {
	if !reflect.DeepEqual(s.c.node, node) || !slices.Equal(s.c.serviceCIDRs, serviceCIDRs) {
		return m.Changes{}, false
	}
	d := newDelta(s)
	for _, pc := range ports {
		if pc.delta != nil && s.patch(d, pc) {
			continue
		}
		var before, after *piece
		if pc.old != nil {
			if kept, ok := s.wide[pc.old.Name]; ok && kept.sp == pc.old && kept.w == nil {
				before = kept.p
			} else {
				before = s.c.piece(pc.old)
			}
			delete(s.wide, pc.old.Name)
			s.spellSlots(before)
		}
		if pc.new != nil {
			after = s.c.piece(pc.new)
			s.keep(pc.new, after)
		}
		d.replace(before, after)
		s.prune = removedAffinity(s.prune, before, after)
		if after == nil {
			after = &piece{}
		}
		s.noteSlots(before, after)
	}
	if !s.fits() {
		return m.Changes{}, false
	}
	return d.changes(), true
}

// delta gathers the changes of one update. Shared objects and elements are
// reference counted; only their net change over the update counts, so a
// chain one service port stops using and another starts using stays.
type delta struct {
	s                *incremental
	del, add         map[*m.Set][]m.Element
	c                m.Changes
	sharedBefore     map[sharedObj]int
	hairpinBefore    map[netip.Addr]int
	clusterIPsBefore map[netip.Addr]int
}

func newDelta(s *incremental) *delta {
	return &delta{s: s, del: map[*m.Set][]m.Element{}, add: map[*m.Set][]m.Element{},
		sharedBefore: map[sharedObj]int{}, hairpinBefore: map[netip.Addr]int{}, clusterIPsBefore: map[netip.Addr]int{}}
}

// replace swaps piece old (nil: none) for piece new (nil: none).
func (d *delta) replace(old, new *piece) {
	if old == nil {
		old = &piece{}
	}
	if new == nil {
		new = &piece{}
	}
	// The endpoint addresses both versions have change no reference count:
	// only the others are counted (a wide service keeps thousands).
	oldRefs, newRefs := *old, *new
	oldRefs.hairpin, newRefs.hairpin = symmetricDifference(old.hairpin, new.hairpin)
	d.remember(&oldRefs)
	d.remember(&newRefs)
	d.s.count(&oldRefs, -1)
	d.s.count(&newRefs, 1)

	// Elements: a key that stays with the same element is left alone; one
	// whose value changes is deleted and added again, as Diff does. (A wide
	// service has thousands: matched through a map, not pair by pair.)
	oldAt := make(map[elementKey]int, len(old.elements))
	for i, o := range old.elements {
		oldAt[keyOf(o)] = i
	}
	for _, n := range new.elements {
		k := keyOf(n)
		i, ok := oldAt[k]
		if ok && elementEqual(old.elements[i].el, n.el) {
			oldAt[k] = -1 // stays
			continue
		}
		if ok {
			d.del[n.set] = append(d.del[n.set], old.elements[i].el)
			oldAt[k] = -1
		}
		d.add[n.set] = append(d.add[n.set], n.el)
	}
	for _, o := range old.elements {
		if oldAt[keyOf(o)] >= 0 {
			d.del[o.set] = append(d.del[o.set], o.el)
		}
	}
	d.replaceRuns(old.runs, new.runs)
}

// symmetricDifference returns what of a is not in b and what of b is not
// in a (both lists hold each address once).
func symmetricDifference(a, b []netip.Addr) (onlyA, onlyB []netip.Addr) {
	if len(a) == 0 || len(b) == 0 {
		return a, b
	}
	if slices.IsSortedFunc(a, netip.Addr.Compare) && slices.IsSortedFunc(b, netip.Addr.Compare) {
		// The common case (hairpinAddrs sorts): one merge walk, no map.
		for len(a) > 0 || len(b) > 0 {
			switch c := walkOrder(len(a), len(b), func() int { return a[0].Compare(b[0]) }); {
			case c < 0:
				onlyA, a = append(onlyA, a[0]), a[1:]
			case c > 0:
				onlyB, b = append(onlyB, b[0]), b[1:]
			default:
				a, b = a[1:], b[1:]
			}
		}
		return onlyA, onlyB
	}
	inA := make(map[netip.Addr]bool, len(a))
	for _, x := range a {
		inA[x] = true
	}
	for _, x := range b {
		if inA[x] {
			delete(inA, x)
		} else {
			onlyB = append(onlyB, x)
		}
	}
	for _, x := range a {
		if inA[x] {
			onlyA = append(onlyA, x)
		}
	}
	return onlyA, onlyB
}

// replaceRuns adds the changes from old's endpoint map elements to new's:
// runs of the same key compare slot by slot, so an endpoint replaced in a
// wide service costs its slot, not a compiled element per endpoint.
func (d *delta) replaceRuns(old, new []slotRun) {
	oldAt := make(map[elementKey]int, len(old))
	for i, o := range old {
		oldAt[runKey(o)] = i
	}
	all := func(r slotRun, to map[*m.Set][]m.Element) {
		to[r.set] = r.appendElements(to[r.set])
	}
	for _, n := range new {
		i, ok := oldAt[runKey(n)]
		if !ok {
			all(n, d.add)
			continue
		}
		delete(oldAt, runKey(n))
		o := old[i]
		for slot := range max(o.eps.len(), n.eps.len()) {
			switch {
			case slot >= n.eps.len():
				d.del[o.set] = append(d.del[o.set], o.element(slot, make([]m.Value, len(o.key)+1), make([]m.Value, 2)))
			case slot >= o.eps.len():
				d.add[n.set] = append(d.add[n.set], n.element(slot, make([]m.Value, len(n.key)+1), make([]m.Value, 2)))
			case o.eps.addrPort(slot) != n.eps.addrPort(slot):
				d.del[o.set] = append(d.del[o.set], o.element(slot, make([]m.Value, len(o.key)+1), make([]m.Value, 2)))
				d.add[n.set] = append(d.add[n.set], n.element(slot, make([]m.Value, len(n.key)+1), make([]m.Value, 2)))
			}
		}
	}
	for _, o := range old {
		if _, gone := oldAt[runKey(o)]; gone {
			all(o, d.del)
		}
	}
}

// runKey identifies a run: its map and key; a key's runs differ by their
// offset, which the key's last part holds.
func runKey(r slotRun) elementKey {
	return keyOf(keyedElement{r.set, m.Element{Key: append(slices.Clip(r.key), m.N(r.offset))}})
}

// matchRuns returns, for each run of old, the index of new's run of the
// same key; -1 when there is none.
func matchRuns(old, new []slotRun) []int {
	at := make(map[elementKey]int, len(new))
	for i, r := range new {
		at[runKey(r)] = i
	}
	out := make([]int, len(old))
	for i, r := range old {
		j, ok := at[runKey(r)]
		if !ok {
			j = -1
		}
		out[i] = j
	}
	return out
}

// remember notes the reference counts before the update of what p refers to.
func (d *delta) remember(p *piece) {
	for _, o := range p.uses {
		if _, ok := d.sharedBefore[o]; !ok {
			d.sharedBefore[o] = d.s.shared[o]
		}
	}
	for _, a := range p.hairpin {
		if _, ok := d.hairpinBefore[a]; !ok {
			d.hairpinBefore[a] = d.s.hairpin[a]
		}
	}
	for _, a := range p.clusterIPs {
		if _, ok := d.clusterIPsBefore[a]; !ok {
			d.clusterIPsBefore[a] = d.s.clusterIPs[a]
		}
	}
}

// changes adds the net changes of the shared objects and returns the whole.
func (d *delta) changes() m.Changes {
	s, c := d.s, d.c
	for _, o := range slices.SortedFunc(maps.Keys(d.sharedBefore), compareShared) {
		before, after := d.sharedBefore[o] > 0, s.shared[o] > 0
		if after {
			if !before {
				ch := s.c.sharedChain(o)
				c.AddChains = append(c.AddChains, ch)
				c.RewriteChains = append(c.RewriteChains, ch)
			}
			continue
		}
		delete(s.shared, o)
		if before {
			c.DelChains = append(c.DelChains, s.c.sharedChainName(o))
		}
	}
	addrs := func(set *m.Set, before, now map[netip.Addr]int, element func(netip.Addr) m.Element) {
		var changed []netip.Addr
		for a, n := range before {
			if (n > 0) != (now[a] > 0) {
				changed = append(changed, a)
			}
		}
		slices.SortFunc(changed, netip.Addr.Compare)
		for _, a := range changed {
			if now[a] > 0 {
				d.add[set] = append(d.add[set], element(a))
			} else {
				d.del[set] = append(d.del[set], element(a))
			}
		}
	}
	addrs(s.c.hairpin, d.hairpinBefore, s.hairpin, hairpinElement)
	addrs(s.c.clusterIPs, d.clusterIPsBefore, s.clusterIPs, clusterIPElement)
	c.DelElements = setElements(d.del)
	c.AddElements = setElements(d.add)
	return c
}

// setElements lists the elements by set, sets by name.
func setElements(bySet map[*m.Set][]m.Element) []m.SetElements {
	var out []m.SetElements
	for set, els := range bySet {
		if len(els) > 0 {
			out = append(out, m.SetElements{Set: set.Name, Key: set.Key, Data: set.Data, Timeout: set.Timeout, Interval: set.Interval, Elements: els})
		}
	}
	slices.SortFunc(out, func(a, b m.SetElements) int { return cmp.Compare(a.Set, b.Set) })
	return out
}

// elementKey identifies an element of a shared set: its set and key
// values (keys have at most four parts), without an allocation.
type elementKey struct {
	set   *m.Set
	n     int
	parts [4]m.Value
}

func keyOf(ke keyedElement) elementKey {
	k := elementKey{set: ke.set, n: len(ke.el.Key)}
	copy(k.parts[:], ke.el.Key)
	return k
}

func elementEqual(a, b m.Element) bool {
	return slices.Equal(a.Key, b.Key) && slices.Equal(a.KeyEnd, b.KeyEnd) && slices.Equal(a.Data, b.Data) && a.Comment == b.Comment &&
		(a.Verdict == nil) == (b.Verdict == nil) && (a.Verdict == nil || *a.Verdict == *b.Verdict)
}

// walkOrder tells which head a merge walk over two sorted lists, with
// aLeft and bLeft items left, takes next: negative a's, positive b's, zero
// both (compare says which when both have items).
func walkOrder(aLeft, bLeft int, compare func() int) int {
	switch {
	case aLeft == 0:
		return 1
	case bLeft == 0:
		return -1
	}
	return compare()
}
