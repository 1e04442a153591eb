package nftmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Packet is the first packet of a new connection, as Trace sees it. Being the
// first packet matters: NAT chains see only the first packet of a connection,
// and conntrack never calls it invalid.
type Packet struct {
	Src, Dst         netip.Addr
	Proto            uint8 // IP protocol number: 6 TCP, 17 UDP, 132 SCTP
	SrcPort, DstPort uint16
	// Local tells which addresses belong to the node (fib daddr type local,
	// and the routing decision between input and forward). nil: none.
	Local func(netip.Addr) bool
	// Hook is where the packet enters: HookPrerouting for a packet arriving
	// from a pod or from outside (the zero value), HookOutput for one the
	// node sends itself.
	Hook Hook
	Mark uint32
	// Iif is the name of the interface the packet arrives on (empty for a
	// packet the node sends).
	Iif string
}

// Verdicts of a traced packet.
const (
	VerdictAccept = "accept" // the packet goes on, DNATed or untouched
	VerdictDrop   = "drop"
	VerdictReject = "reject"
)

// Branch is one way through the ruleset: numgen makes a random choice, and
// Trace follows every value it can take.
type Branch struct {
	// Choices are the numgen values taken on the way, outermost first; empty
	// when the packet met no numgen.
	Choices []int
	// Endpoint is the destination after DNAT; the zero value when no DNAT
	// happened.
	Endpoint   netip.AddrPort
	Masquerade bool // a masquerade statement ran
	Verdict    string
}

// Outcome is what happens to a packet.
type Outcome struct {
	// Steps are the hooks and chains walked, with the rule that matched in
	// each, in order. After a numgen fork every branch's steps follow in turn,
	// prefixed with its choices ("[1] endpoint-1: …").
	Steps []string
	// Endpoints are the DNAT targets of the accepted branches, sorted and
	// de-duplicated.
	Endpoints []netip.AddrPort
	// Masquerade tells whether a masquerade statement ran on at least one
	// accepted branch.
	Masquerade bool
	// Verdict is the verdict of every branch; when branches differ, their
	// distinct verdicts in the order accept, drop, reject, joined with "|".
	Verdict  string
	Branches []Branch
}

// Trace walks p through rs the way netfilter would for the first packet of a
// connection, and reports every way it can go.
//
// The path follows the packet's hooks: from HookPrerouting, the prerouting
// base chains, then the routing decision on the (possibly DNATed) destination:
// a local one goes to input, any other to forward and postrouting. From
// HookOutput, the output base chains, then postrouting; a local destination
// then comes back in over loopback through prerouting and input, where NAT
// chains no longer run because conntrack already holds the connection's NAT
// bindings. On each hook the base chains run in priority order (model order
// among equal priorities) and every base chain's policy is accept.
//
// Masquerade is modelled by running the postrouting chains like any other:
// whatever they match (a mark, the hairpin set of endpoint . endpoint pairs
// against saddr . daddr after DNAT) decides whether a masquerade statement
// runs. DNAT, masquerade and reject end their base chain as in the kernel.
//
// Trace panics on a ruleset the kernel would refuse to load: an unknown
// expression, a jump to a missing chain, a lookup in a missing set, jumps
// nested too deep or a loop.
func Trace(rs *Ruleset, p Packet) Outcome {
	if p.Hook != HookPrerouting && p.Hook != HookOutput {
		panic(fmt.Sprintf("nftmodel: trace: packets enter at prerouting or output, not at hook %d", p.Hook))
	}
	t := &tracer{
		rs:     rs,
		chains: make(map[string]*Chain, len(rs.Chains)),
		sets:   make(map[string]*Set, len(rs.Sets)),
		local:  p.Local,
		iif:    p.Iif,
		entry:  p.Hook,
		budget: maxRuleEvaluations,
	}
	for _, c := range rs.Chains {
		t.chains[c.Name] = c
	}
	for _, s := range rs.Sets {
		t.sets[s.Name] = s
	}
	w := &walk{
		src: p.Src.Unmap(), dst: p.Dst.Unmap(), proto: p.Proto, sport: p.SrcPort, dport: p.DstPort,
		mark: p.Mark, stage: stage{hook: p.Hook}, base: -1,
	}
	inFamily := func(a netip.Addr) bool { return a.IsValid() && a.Is4() == (rs.Family == IPv4) }
	if !inFamily(w.src) || !inFamily(w.dst) {
		t.step(w, fmt.Sprintf("table %s %s: not an %s packet, not seen", rs.Family, rs.Table, familyName(rs.Family)))
		t.finish(w, VerdictAccept)
	} else {
		t.run(w)
	}
	return t.outcome()
}

func familyName(f Family) string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

const (
	// maxJumpDepth is the kernel's jump stack size (NFT_JUMP_STACK_SIZE): it
	// refuses to load a table whose jumps nest deeper.
	maxJumpDepth = 16
	// maxRuleEvaluations stops a goto loop, which the kernel would refuse too.
	maxRuleEvaluations = 1 << 16
)

type tracer struct {
	rs       *Ruleset
	chains   map[string]*Chain
	sets     map[string]*Set
	local    func(netip.Addr) bool
	iif      string
	entry    Hook
	budget   int
	steps    []string
	branches []Branch
}

// stage is one hook on the packet's path.
type stage struct {
	hook     Hook
	loopback bool // back in over loopback: NAT chains don't run again
}

type frame struct {
	chain *Chain
	next  int // index of the next rule to evaluate
}

// walk is the state of one branch: the packet as rewritten so far and where
// evaluation stands. Forking a branch copies it.
type walk struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
	mark         uint32
	dnat         netip.AddrPort // valid once DNATed
	orig         netip.AddrPort // the destination before DNAT, once DNATed
	masq         bool
	choices      []int
	slot         uint32 // the numgen value of the rule about to run
	slotChosen   bool
	stage        stage
	base         int // index among the stage's base chains of the one running
	stack        []frame
}

func (w *walk) clone() *walk {
	c := *w
	c.choices = slices.Clone(w.choices)
	c.stack = slices.Clone(w.stack)
	return &c
}

func (t *tracer) isLocal(a netip.Addr) bool { return t.local != nil && t.local(a) }

// iifMatches compares the input interface with an iifname pattern. A packet
// the node sends has no input interface until it comes back over loopback.
func (t *tracer) iifMatches(w *walk, pattern string) bool {
	iif := t.iif
	if t.entry == HookOutput {
		iif = ""
		if w.stage.loopback {
			iif = "lo"
		}
	}
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return iif != "" && strings.HasPrefix(iif, prefix)
	}
	return iif == pattern
}

func (t *tracer) step(w *walk, s string) {
	if len(w.choices) > 0 {
		s = choiceLabel(w.choices) + " " + s
	}
	t.steps = append(t.steps, s)
}

func choiceLabel(choices []int) string {
	parts := make([]string, len(choices))
	for i, c := range choices {
		parts[i] = fmt.Sprint(c)
	}
	return "[" + strings.Join(parts, ".") + "]"
}

// baseChains returns the base chains of a stage in the order the kernel runs
// them.
func (t *tracer) baseChains(s stage) []*Chain {
	var out []*Chain
	for _, c := range t.rs.Chains {
		if c.Base == nil || c.Base.Hook != s.hook || (s.loopback && c.Base.Type == TypeNAT) {
			continue
		}
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b *Chain) int {
		switch pa, pb := a.Base.Priority, b.Base.Priority; {
		case pa < pb:
			return -1
		case pa > pb:
			return 1
		}
		return 0
	})
	return out
}

// nextStage is the hook after s, or false at the end of the path.
func (t *tracer) nextStage(w *walk, s stage) (stage, bool) {
	switch {
	case s.hook == HookPrerouting && s.loopback:
		return stage{hook: HookInput, loopback: true}, true
	case s.hook == HookPrerouting:
		if t.isLocal(w.dst) {
			t.step(w, fmt.Sprintf("route: %s is local: input", w.dst))
			return stage{hook: HookInput}, true
		}
		t.step(w, fmt.Sprintf("route: %s is not local: forward", w.dst))
		return stage{hook: HookForward}, true
	case s.hook == HookForward, s.hook == HookOutput:
		return stage{hook: HookPostrouting}, true
	case s.hook == HookPostrouting && t.entry == HookOutput && t.isLocal(w.dst):
		t.step(w, fmt.Sprintf("route: %s is local: back in over loopback", w.dst))
		return stage{hook: HookPrerouting, loopback: true}, true
	}
	return stage{}, false
}

// nextBase starts the next base chain on the path; false when the packet
// has passed every hook.
func (t *tracer) nextBase(w *walk) bool {
	for {
		chains := t.baseChains(w.stage)
		w.base++
		if w.base < len(chains) {
			c := chains[w.base]
			where := "hook " + c.Base.Hook.String()
			if w.stage.loopback {
				where += " (loopback)"
			}
			t.step(w, fmt.Sprintf("%s: %s (type %s, priority %d)", where, c.Name, c.Base.Type, c.Base.Priority))
			w.stack = append(w.stack, frame{chain: c})
			return true
		}
		next, ok := t.nextStage(w, w.stage)
		if !ok {
			return false
		}
		w.stage, w.base = next, -1
	}
}

// run evaluates one branch to its end, forking at every numgen.
func (t *tracer) run(w *walk) {
	for {
		if len(w.stack) == 0 {
			if !t.nextBase(w) {
				t.finish(w, VerdictAccept)
				return
			}
			continue
		}
		top := &w.stack[len(w.stack)-1]
		if top.next == len(top.chain.Rules) {
			t.leave(w)
			continue
		}
		r := top.chain.Rules[top.next]
		if n := ruleNumgen(r); n > 0 && !w.slotChosen && t.matchesBeforeNumgen(w, r) {
			// The rule looks a random slot up: each value is a branch that
			// evaluates the rule with it.
			text := top.chain.Name + ": " + RenderRule(t.rs.Family, r)
			for i := range int(n) {
				t.step(w, fmt.Sprintf("%s -> %s numgen %d", text, choiceLabel(append(slices.Clone(w.choices), i)), i))
				b := w.clone()
				b.choices = append(b.choices, i)
				b.slot, b.slotChosen = uint32(i), true
				t.run(b)
			}
			return
		}
		top.next++
		if t.budget--; t.budget < 0 {
			panic(fmt.Sprintf("nftmodel: trace: more than %d rules evaluated: a chain loop through %s", maxRuleEvaluations, top.chain.Name))
		}
		chain := top.chain
		a := t.eval(w, r)
		w.slotChosen = false
		if a.kind == actNoMatch {
			continue
		}
		text := chain.Name + ": " + RenderRule(t.rs.Family, r)
		if a.kind == actFork {
			for i, target := range a.targets {
				t.step(w, fmt.Sprintf("%s -> %s goto %s", text, choiceLabel(append(slices.Clone(w.choices), i)), target))
				b := w.clone()
				b.choices = append(b.choices, i)
				t.gotoChain(b, target)
				t.run(b)
			}
			return
		}
		if a.note != "" {
			text += " -> " + a.note
		}
		t.step(w, text)
		switch a.kind {
		case actContinue:
		case actAccept:
			w.stack = w.stack[:0]
		case actDrop:
			t.finish(w, VerdictDrop)
			return
		case actReject:
			t.finish(w, VerdictReject)
			return
		case actReturn:
			w.stack = w.stack[:len(w.stack)-1]
			t.returned(w)
		case actJump:
			if len(w.stack) > maxJumpDepth {
				panic(fmt.Sprintf("nftmodel: trace: jumps nested deeper than %d at %s", maxJumpDepth, a.chain))
			}
			w.stack = append(w.stack, frame{chain: t.chain(a.chain)})
		case actGoto:
			t.gotoChain(w, a.chain)
		}
	}
}

// gotoChain replaces the running chain: when the target ends, evaluation
// goes back to whoever jumped to the chain that did the goto.
func (t *tracer) gotoChain(w *walk, name string) {
	w.stack[len(w.stack)-1] = frame{chain: t.chain(name)}
}

// leave pops the running chain at its end.
func (t *tracer) leave(w *walk) {
	name := w.stack[len(w.stack)-1].chain.Name
	w.stack = w.stack[:len(w.stack)-1]
	if len(w.stack) == 0 {
		t.step(w, name+": end of chain, policy accept")
		return
	}
	t.step(w, fmt.Sprintf("%s: end of chain, back to %s", name, w.stack[len(w.stack)-1].chain.Name))
}

// returned notes where a return statement sent evaluation.
func (t *tracer) returned(w *walk) {
	if len(w.stack) == 0 {
		t.steps[len(t.steps)-1] += ", policy accept"
		return
	}
	t.steps[len(t.steps)-1] += ", back to " + w.stack[len(w.stack)-1].chain.Name
}

func (t *tracer) chain(name string) *Chain {
	c, ok := t.chains[name]
	if !ok {
		panic(fmt.Sprintf("nftmodel: trace: jump to missing chain %q", name))
	}
	return c
}

func (t *tracer) set(name string) *Set {
	s, ok := t.sets[name]
	if !ok {
		panic(fmt.Sprintf("nftmodel: trace: lookup in missing set %q", name))
	}
	return s
}

func (t *tracer) finish(w *walk, verdict string) {
	b := Branch{Choices: w.choices, Endpoint: w.dnat, Masquerade: w.masq, Verdict: verdict}
	t.branches = append(t.branches, b)
	msg := "verdict: " + verdict
	if w.dnat.IsValid() {
		msg += ", DNAT to " + w.dnat.String()
	}
	if w.masq {
		msg += ", masquerade"
	}
	t.step(w, msg)
}

func (t *tracer) outcome() Outcome {
	o := Outcome{Steps: t.steps, Branches: t.branches}
	var verdicts []string
	for _, b := range t.branches {
		if !slices.Contains(verdicts, b.Verdict) {
			verdicts = append(verdicts, b.Verdict)
		}
		if b.Verdict != VerdictAccept {
			continue
		}
		if b.Endpoint.IsValid() {
			o.Endpoints = append(o.Endpoints, b.Endpoint)
		}
		o.Masquerade = o.Masquerade || b.Masquerade
	}
	order := []string{VerdictAccept, VerdictDrop, VerdictReject}
	slices.SortFunc(verdicts, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	o.Verdict = strings.Join(verdicts, "|")
	slices.SortFunc(o.Endpoints, netip.AddrPort.Compare)
	o.Endpoints = slices.Compact(o.Endpoints)
	return o
}

type actionKind uint8

const (
	actNoMatch  actionKind = iota // a match failed or a lookup missed
	actContinue                   // the rule ran without a verdict
	actAccept
	actDrop
	actReject
	actReturn
	actJump
	actGoto
	actFork
)

type action struct {
	kind    actionKind
	chain   string   // for actJump and actGoto
	targets []string // for actFork
	note    string   // what a lookup found or a statement did
}

// eval runs a rule's expressions left to right. Statements take effect as
// they run, even when a later match in the same rule fails, as in the kernel.
func (t *tracer) eval(w *walk, r Rule) action {
	var notes []string
	for _, e := range r.Exprs {
		if matched, ok := t.match(w, e); ok {
			if !matched {
				return action{kind: actNoMatch}
			}
			continue
		}
		if note, ok := w.statement(e); ok {
			if note != "" {
				notes = append(notes, note)
			}
			continue
		}
		a := t.final(w, e)
		if a.kind == actNoMatch {
			return a
		}
		return withNotes(a, notes)
	}
	return withNotes(action{kind: actContinue}, notes)
}

// withNotes prefixes what the rule's statements did to a's own note.
func withNotes(a action, notes []string) action {
	if a.note != "" {
		notes = append(notes, a.note)
	}
	a.note = strings.Join(notes, ", ")
	return a
}

// match tells whether the packet passes e; ok is false when e is no match.
func (t *tracer) match(w *walk, e Expr) (matched, ok bool) {
	switch e := e.(type) {
	case MatchPrefix:
		return e.Prefix.Contains(w.field(e.Field).Addr) != e.Negate, true
	case MatchL4Proto:
		return w.proto == e.Proto, true
	case MatchMark:
		return (w.mark&e.Mask != 0) == e.IsSet, true
	case MatchFibDaddrLocal:
		return t.isLocal(w.dst), true
	case MatchFibSaddrLocal:
		return t.isLocal(w.src), true
	case MatchCtStateInvalid:
		// The first packet of a connection is new, never invalid.
		return false, true
	case MatchCtStatusDNAT:
		return w.dnat.IsValid() != e.Negate, true
	case MatchCtStateEstablished:
		// The first packet of a connection is new.
		return e.Negate, true
	case MatchIifname:
		return t.iifMatches(w, e.Name) != e.Negate, true
	case MatchSet:
		_, found := t.lookup(w, e.Set, e.Key)
		return found != e.Negate, true
	}
	return false, false
}

// statement runs e when it is a statement that lets the rule go on, and
// returns what it did; ok is false when e is none.
func (w *walk) statement(e Expr) (note string, ok bool) {
	switch e := e.(type) {
	case UpdateSet:
		// Affinity state is not modelled: a new client is in no set.
		return "", true
	case UpdateMap:
		return traceUpdateMap(e), true
	case Counter:
		return "", true
	case MarkOr:
		w.mark |= e.Bits
		return fmt.Sprintf("mark 0x%08x", w.mark), true
	case MarkXor:
		w.mark ^= e.Bits
		return fmt.Sprintf("mark 0x%08x", w.mark), true
	}
	return "", false
}

// final evaluates an expression that ends the rule: a verdict, a lookup
// that yields one, or a statement the kernel ends the base chain with. Any
// other expression is one the kernel would not know.
func (t *tracer) final(w *walk, e Expr) action {
	switch e := e.(type) {
	case VerdictMap:
		el, ok := t.lookup(w, e.Map, e.Key)
		if !ok {
			return action{kind: actNoMatch}
		}
		if el.Verdict == nil {
			panic(fmt.Sprintf("nftmodel: trace: vmap lookup in %q, which holds no verdicts", e.Map))
		}
		return verdictAction(*el.Verdict, true)
	case NumgenGoto:
		return action{kind: actFork, targets: e.Chains}
	case DNATMap:
		return t.dnatMap(w, e)
	case DNAT:
		if w.proto != e.Proto {
			return action{kind: actNoMatch}
		}
		return w.doDNAT(e.Addr, e.Port)
	case Masquerade:
		w.masq = true
		return action{kind: actAccept}
	case Reject:
		// nft adds "meta l4proto tcp" before a TCP reset.
		if e.TCPReset && w.proto != 6 {
			return action{kind: actNoMatch}
		}
		return action{kind: actReject}
	case Verdict:
		return verdictAction(e, false)
	}
	panic(fmt.Sprintf("nftmodel: trace: unknown expression %T", e))
}

// dnatMap DNATs to the address [. port] the map holds for the packet's key,
// with the numgen slot the branch chose appended when the map draws one.
func (t *tracer) dnatMap(w *walk, e DNATMap) action {
	want := w.fields(e.Key)
	if e.Numgen > 0 {
		want = append(want, N(w.slot+e.Offset))
	}
	el, ok := t.lookupValues(e.Map, want)
	if !ok {
		return action{kind: actNoMatch}
	}
	if len(el.Data) == 0 || len(el.Data) > 2 {
		panic(fmt.Sprintf("nftmodel: trace: dnat map %q holds %d values, want address [. port]", e.Map, len(el.Data)))
	}
	port := w.dport
	if len(el.Data) == 2 {
		port = uint16(el.Data[1].Num)
	}
	return w.doDNAT(el.Data[0].Addr, port)
}

func verdictAction(v Verdict, fromMap bool) action {
	var a action
	switch v.Kind {
	case Accept:
		a = action{kind: actAccept}
	case Drop:
		a = action{kind: actDrop}
	case Return:
		a = action{kind: actReturn}
	case Jump:
		a = action{kind: actJump, chain: v.Chain}
	case Goto:
		a = action{kind: actGoto, chain: v.Chain}
	default:
		panic(fmt.Sprintf("nftmodel: trace: unknown verdict kind %d", v.Kind))
	}
	if fromMap {
		a.note = renderVerdict(v)
	}
	return a
}

func (w *walk) doDNAT(addr netip.Addr, port uint16) action {
	if !w.dnat.IsValid() {
		w.orig = netip.AddrPortFrom(w.dst, w.dport)
	}
	w.dst, w.dport = addr.Unmap(), port
	w.dnat = netip.AddrPortFrom(w.dst, w.dport)
	return action{kind: actAccept, note: "dnat to " + w.dnat.String()}
}

// field is the packet's current value of f, as set elements hold it.
func (w *walk) field(f Field) Value {
	switch f {
	case FieldSaddr:
		return A(w.src)
	case FieldDaddr:
		return A(w.dst)
	case FieldL4Proto:
		return N(uint32(w.proto))
	case FieldTHDport:
		return N(uint32(w.dport))
	case FieldCtOriginalDaddr, FieldCtOriginalProtoDst, FieldCtReplySaddr, FieldCtReplyProtoSrc:
		return w.ctField(f)
	}
	panic(fmt.Sprintf("nftmodel: trace: unknown field %d", f))
}

// lookup finds the element of the named set whose key is the concatenation
// of the packet's fields.
func (t *tracer) lookup(w *walk, name string, key []Field) (Element, bool) {
	return t.lookupValues(name, w.fields(key))
}

// fields is the packet's current values of fs.
func (w *walk) fields(fs []Field) []Value {
	out := make([]Value, len(fs), len(fs)+1)
	for i, f := range fs {
		out[i] = w.field(f)
	}
	return out
}

// matchesBeforeNumgen tells whether the expressions before a rule's
// numgen lookup match the packet: a rule that can't match draws no
// number, and its slots would be branches that all end alike.
func (t *tracer) matchesBeforeNumgen(w *walk, r Rule) bool {
	i := slices.IndexFunc(r.Exprs, func(e Expr) bool { d, ok := e.(DNATMap); return ok && d.Numgen > 0 })
	if i <= 0 {
		return true
	}
	return t.eval(w.clone(), Rule{Exprs: r.Exprs[:i]}).kind != actNoMatch
}

// ruleNumgen is the modulus of the numgen a rule's map lookup draws, 0 for
// none.
func ruleNumgen(r Rule) uint32 {
	for _, e := range r.Exprs {
		if d, ok := e.(DNATMap); ok && d.Numgen > 0 {
			return d.Numgen
		}
	}
	return 0
}

// lookupValues finds the element of the named set whose key is want.
func (t *tracer) lookupValues(name string, want []Value) (Element, bool) {
	s := t.set(name)
	if len(want) != len(s.Key) {
		panic(fmt.Sprintf("nftmodel: trace: key of %d parts for %q, whose key has %d parts", len(want), name, len(s.Key)))
	}
	for _, el := range s.All() {
		if s.Interval && el.Contains(want) {
			return el, true
		}
		if slices.EqualFunc(el.Key, want, func(a, b Value) bool { return a.Addr.Unmap() == b.Addr && a.Num == b.Num }) {
			return el, true
		}
	}
	return Element{}, false
}

// ctField is a conntrack field's value for the packet's connection: the
// original destination is the one before DNAT, the reply's source the
// destination now.
func (w *walk) ctField(f Field) Value {
	orig := netip.AddrPortFrom(w.dst, w.dport)
	if w.dnat.IsValid() {
		orig = w.orig
	}
	switch f {
	case FieldCtOriginalDaddr:
		return A(orig.Addr())
	case FieldCtOriginalProtoDst:
		return N(uint32(orig.Port()))
	case FieldCtReplySaddr:
		return A(w.dst)
	}
	return N(uint32(w.dport)) // FieldCtReplyProtoSrc
}

// traceUpdateMap notes an UpdateMap: the tracer keeps no affinity state, so
// the next packet is as new as this one.
func traceUpdateMap(e UpdateMap) string { return "remembered in @" + e.Map }
