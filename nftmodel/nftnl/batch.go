package nftnl

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// batch plans one transaction. Everything that can fail in translation fails
// before anything is sent, so an invalid model never leaves a half-built
// batch behind: tables, chains, rules and sets while planning, set elements
// (made once, as the batch is written) in send. conn is only read from (and
// names the namespace the batch goes to); the library encodes its messages
// on a libEncoder, which sends nothing.
type batch struct {
	conn *Conn
	lib  *libEncoder
	// subject names what the batch changes in its errors: its table, or
	// what a batch on several tables deletes.
	subject string
	family  nftmodel.Family
	table   *nftables.Table
	stats   nftmodel.Stats
	steps   []step
	sets    map[string]*nftables.Set // sets whose elements the batch may touch
	types   map[string]*nftmodel.Set // their types (Name, Key and Data only)
	// userData is the user data of the sets declared with typeof, which
	// the library can't write: send puts it into their messages.
	userData map[string][]byte
}

// step is one part of the batch: msgs messages the library encodes when
// queue runs, or the elements of a set, written directly in as many
// messages as they need (elements); what describes it in errors.
type step struct {
	what     string
	msgs     int
	queue    func() error
	elements *elementsStep
	// userData, when set, replaces the user data of the step's one message,
	// a set the library encoded.
	userData []byte
}

// elementsStep adds or deletes every element of src in a set. The elements
// are checked and split into messages as the batch is written (wire.elements),
// so a full sync makes each of its thousands once and never holds them.
type elementsStep struct {
	set *nftables.Set
	enc *elementEncoder
	src nftmodel.ElementSource
	add bool
}

func (e *elementsStep) verb() string {
	if e.add {
		return "add"
	}
	return "delete"
}

// listSource gives the elements of a list as a source, in place.
type listSource []nftmodel.Element

func (l listSource) Len() int                           { return len(l) }
func (l listSource) Element(i int, e *nftmodel.Element) { *e = l[i] }

// newBatch plans a transaction on the table (f, table).
func newBatch(conn *Conn, f nftmodel.Family, table string) *batch {
	b := newTablesBatch(conn, fmt.Sprintf("table %s %s", f, table))
	b.family, b.table = f, &nftables.Table{Name: table, Family: libFamily(f)}
	return b
}

// newTablesBatch plans a transaction whose steps name their own tables, of
// any family; subject names it in errors. It has no table of its own, so it
// takes library calls only, no set elements.
func newTablesBatch(conn *Conn, subject string) *batch {
	return &batch{
		conn:     conn,
		lib:      newLibEncoder(),
		subject:  subject,
		sets:     map[string]*nftables.Set{},
		types:    map[string]*nftmodel.Set{},
		userData: map[string][]byte{},
	}
}

func (b *batch) plan(msgs int, queue func() error, format string, args ...any) {
	b.steps = append(b.steps, step{what: fmt.Sprintf(format, args...), msgs: msgs, queue: queue})
}

// plan1 plans a library call that queues one message and can't fail.
func (b *batch) plan1(queue func(), format string, args ...any) {
	b.plan(1, func() error { queue(); return nil }, format, args...)
}

func (b *batch) fail(verb string, err error) error {
	return fmt.Errorf("%s %s: %w", verb, b.subject, err)
}

func (b *batch) addTable() {
	b.plan1(func() { b.lib.AddTable(b.table) }, "add table %s %s", b.family, b.table.Name)
}

func (b *batch) delTable() {
	b.plan1(func() { b.lib.DelTable(b.table) }, "delete table %s %s", b.family, b.table.Name)
}

// declare makes s known to the batch, so that its elements can be planned,
// without planning its creation.
func (b *batch) declare(s *nftmodel.Set) (*nftables.Set, error) {
	ls, err := libSet(b.table, s)
	if err != nil {
		return nil, err
	}
	if s.Typeof != nil {
		u, err := typeofUserData(b.family, s)
		if err != nil {
			return nil, fmt.Errorf("declare set %s: %w", s.Name, err)
		}
		b.userData[s.Name] = u
	}
	b.sets[s.Name] = ls
	b.types[s.Name] = s
	return ls, nil
}

func (b *batch) addSet(s *nftmodel.Set) error {
	ls, err := b.declare(s)
	if err != nil {
		return err
	}
	b.addDeclaredSet(ls)
	return nil
}

func (b *batch) addDeclaredSet(ls *nftables.Set) {
	b.plan(1, func() error { return b.lib.AddSet(ls, nil) }, "add set %s", ls.Name)
	b.steps[len(b.steps)-1].userData = b.userData[ls.Name]
	b.stats.Sets++
}

func (b *batch) delSet(name string) {
	ls := &nftables.Set{Table: b.table, Name: name}
	b.plan1(func() { b.lib.DelSet(ls) }, "delete set %s", name)
	b.stats.Sets++
}

// flushSet deletes every element of a set; verdicts among them stop
// referencing their chains.
func (b *batch) flushSet(name string) {
	ls := &nftables.Set{Table: b.table, Name: name}
	b.plan1(func() { b.lib.FlushSet(ls) }, "flush set %s", name)
	b.stats.Sets++
}

func (b *batch) chain(name string) *nftables.Chain {
	return &nftables.Chain{Table: b.table, Name: name}
}

func (b *batch) addChain(c *nftmodel.Chain) {
	lc := libChain(b.table, c)
	b.plan1(func() { b.lib.AddChain(lc) }, "add chain %s", c.Name)
	b.stats.Chains++
}

// libChain returns the library's description of a chain; base chains accept
// what they don't decide.
func libChain(t *nftables.Table, c *nftmodel.Chain) *nftables.Chain {
	lc := &nftables.Chain{Table: t, Name: c.Name}
	if c.Base != nil {
		lc.Type = nftables.ChainTypeFilter
		if c.Base.Type == nftmodel.TypeNAT {
			lc.Type = nftables.ChainTypeNAT
		}
		lc.Hooknum = nftables.ChainHookRef(libHook(c.Base.Hook))
		lc.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(c.Base.Priority))
		accept := nftables.ChainPolicyAccept
		lc.Policy = &accept
	}
	return lc
}

func libHook(h nftmodel.Hook) nftables.ChainHook {
	switch h {
	case nftmodel.HookPrerouting:
		return *nftables.ChainHookPrerouting
	case nftmodel.HookInput:
		return *nftables.ChainHookInput
	case nftmodel.HookForward:
		return *nftables.ChainHookForward
	case nftmodel.HookOutput:
		return *nftables.ChainHookOutput
	default:
		return *nftables.ChainHookPostrouting
	}
}

func (b *batch) flushChain(name string) {
	lc := b.chain(name)
	b.plan1(func() { b.lib.FlushChain(lc) }, "flush chain %s", name)
	b.stats.Chains++
}

// flushTable deletes every rule of every chain in the table in one message,
// and with them the anonymous sets they own.
func (b *batch) flushTable() {
	b.plan1(func() { b.lib.FlushTable(b.table) }, "flush rules of table %s %s", b.family, b.table.Name)
}

func (b *batch) delChain(name string) {
	lc := b.chain(name)
	b.plan1(func() { b.lib.DelChain(lc) }, "delete chain %s", name)
	b.stats.Chains++
}

// addRules appends the chain's rules in order, each preceded by the anonymous
// maps it looks up.
func (b *batch) addRules(c *nftmodel.Chain) error {
	lc := b.chain(c.Name)
	for i, r := range c.Rules {
		if len(r.Comment) > maxCommentLen {
			return fmt.Errorf("add rule %d of chain %s: comment longer than %d bytes", i+1, c.Name, maxCommentLen)
		}
		exprs, anon, err := ruleExprs(b.family, r)
		if err != nil {
			return fmt.Errorf("add rule %d of chain %s: %w", i+1, c.Name, err)
		}
		text := nftmodel.RenderRule(b.family, r)
		for _, m := range anon {
			m.set.Table = b.table
			b.plan(1+anonMessages(m.elements), func() error { return b.lib.AddSet(m.set, m.elements) },
				"add anonymous map of rule %d in chain %s: %s", i+1, c.Name, text)
			b.stats.Elements += len(m.elements)
		}
		lr := &nftables.Rule{Table: b.table, Chain: lc, Exprs: exprs}
		if r.Comment != "" {
			lr.UserData = userdata.AppendString(nil, userdata.TypeComment, r.Comment)
		}
		b.plan1(func() {
			// The anonymous maps got their transaction IDs when queued just
			// now: point the rule's unfinished lookups at them, in order.
			next := 0
			for _, e := range exprs {
				if l, ok := e.(*expr.Lookup); ok && l.SetName == "" && next < len(anon) {
					l.SetName, l.SetID = anon[next].set.Name, anon[next].set.ID
					next++
				}
			}
			b.lib.AddRule(lr)
		}, "add rule %d to chain %s: %s", i+1, c.Name, text)
		b.stats.Rules++
	}
	return nil
}

// learnSets makes sure the batch knows the types of every set whose elements
// c adds or deletes: from c when it says (Diff does), else from the kernel.
func (b *batch) learnSets(c *nftmodel.Changes) error {
	for _, list := range [][]nftmodel.SetElements{c.DelElements, c.AddElements} {
		for _, se := range list {
			if _, ok := b.types[se.Set]; ok {
				continue
			}
			if se.Key != nil {
				b.sets[se.Set] = &nftables.Set{Table: b.table, Name: se.Set, HasTimeout: se.Timeout > 0}
				b.types[se.Set] = &nftmodel.Set{Name: se.Set, Key: se.Key, Data: se.Data, Timeout: se.Timeout, Interval: se.Interval}
				continue
			}
			ls, err := b.conn.getSetByName(b.table, se.Set)
			if err != nil {
				return fmt.Errorf("get set %s: %w", se.Set, err)
			}
			s, err := modelTypes(ls)
			if err != nil {
				return fmt.Errorf("get set %s: %w", se.Set, err)
			}
			b.sets[se.Set] = &nftables.Set{Table: b.table, Name: se.Set, HasTimeout: ls.HasTimeout}
			b.types[se.Set] = s
		}
	}
	return nil
}

// modelTypes reads the key and value types of a set the kernel reported.
func modelTypes(ls *nftables.Set) (*nftmodel.Set, error) {
	s := &nftmodel.Set{Name: ls.Name, Interval: ls.Interval}
	var err error
	if s.Key, err = modelTypeList(ls.KeyType.GetNFTMagic()); err != nil {
		return nil, fmt.Errorf("read key type: %w", err)
	}
	if ls.IsMap {
		if ls.DataType.GetNFTMagic() == nftables.TypeVerdict.GetNFTMagic() {
			s.Data = []nftmodel.DataType{nftmodel.TypeVerdict}
		} else if s.Data, err = modelTypeList(ls.DataType.GetNFTMagic()); err != nil {
			return nil, fmt.Errorf("read data type: %w", err)
		}
	}
	return s, nil
}

// modelTypeList decodes nft's type magic: one type, or a concatenation with
// 6 bits per part, the first part in the highest bits.
func modelTypeList(magic uint32) ([]nftmodel.DataType, error) {
	var out []nftmodel.DataType
	for ; magic != 0; magic >>= nftables.SetConcatTypeBits {
		var t nftmodel.DataType
		switch m := magic & nftables.SetConcatTypeMask; m {
		case nftables.TypeIPAddr.GetNFTMagic():
			t = nftmodel.TypeIPv4Addr
		case nftables.TypeIP6Addr.GetNFTMagic():
			t = nftmodel.TypeIPv6Addr
		case nftables.TypeInetProto.GetNFTMagic():
			t = nftmodel.TypeInetProto
		case nftables.TypeInetService.GetNFTMagic():
			t = nftmodel.TypeInetService
		case nftables.TypeInteger.GetNFTMagic():
			t = nftmodel.TypeInteger
		default:
			return nil, fmt.Errorf("unsupported type %d", m)
		}
		out = append([]nftmodel.DataType{t}, out...)
	}
	if len(out) == 0 {
		return nil, errors.New("no type")
	}
	return out, nil
}

func (b *batch) addElements(set string, els []nftmodel.Element) error {
	if s := b.types[set]; s != nil && s.Interval {
		// nft lists an interval set's elements in the order they came,
		// not sorted: sent sorted, a set filled at once lists as rendered.
		// (Checked first: sorting reads every part of every key.)
		enc := newElementEncoder(s.Key, s.Data, false, true)
		for i := range els {
			if err := enc.check(&els[i]); err != nil {
				return fmt.Errorf("change elements of set %s: %w", set, err)
			}
		}
		els = nftmodel.SortedElements(&nftmodel.Set{Key: s.Key, Elements: els})
	}
	return b.elements(set, listSource(els), true)
}

// addSetElements adds a set's elements, made by its source when it has
// one.
func (b *batch) addSetElements(s *nftmodel.Set) error {
	if s.Source == nil || s.Interval {
		return b.addElements(s.Name, s.All())
	}
	return b.elements(s.Name, s.Source, true)
}

func (b *batch) delElements(set string, els []nftmodel.Element) error {
	return b.elements(set, listSource(els), false)
}

// elements plans adding or deleting the elements of src. They are made,
// checked and split into messages when the batch is written (wire.elements).
func (b *batch) elements(set string, src nftmodel.ElementSource, add bool) error {
	n := src.Len()
	if n == 0 {
		return nil
	}
	s, ls := b.types[set], b.sets[set]
	if s == nil || ls == nil {
		return fmt.Errorf("change elements of set %s: set unknown to this batch", set)
	}
	data := s.Data
	if !add {
		data = nil // a deletion names keys only
	}
	enc := newElementEncoder(s.Key, data, add && s.IsVerdictMap(), s.Interval)
	b.steps = append(b.steps, step{elements: &elementsStep{set: ls, enc: enc, src: src, add: add}})
	b.stats.Elements += n
	return nil
}

// send encodes the planned messages and sends them as one batch. A non-zero
// genID makes the kernel refuse the batch with ERESTART, before looking at
// it, if any table of the namespace changed since that generation. On error
// send names the message the kernel refused.
//
// The library's messages are encoded first, on b.lib, which keeps them
// instead of sending; the batch is then written into one buffer sized for
// it (bufferSize), the library's messages copied in their places and set
// elements encoded in theirs.
func (b *batch) send(verb string, genID uint32) (nftmodel.Stats, error) {
	lib, err := b.encodeLib()
	if err != nil {
		return nftmodel.Stats{}, b.fail(verb, err)
	}
	w, what, err := b.write(lib, genID)
	if err != nil {
		return nftmodel.Stats{}, b.fail(verb, err)
	}
	first := nextSeqs(len(what) + 2)
	w.number(first)

	b.stats.Messages = len(what) + 2
	refused, err := sendBatch(b.conn, w.buf, first, b.stats.Messages)
	if err == nil && refused == nil {
		return b.stats, nil
	}
	where, err := refusedAt(what, first, refused, err)
	return b.stats, fmt.Errorf("%s %s (%s): %w", verb, b.subject, where, err)
}

// encodeLib runs the steps' library calls and returns the messages the
// library encoded for them, in step order, with the user data of sets
// declared with typeof put in.
func (b *batch) encodeLib() ([]netlink.Message, error) {
	planned := 0
	for _, s := range b.steps {
		if s.queue != nil {
			if err := s.queue(); err != nil {
				b.lib.discard()
				return nil, err
			}
			planned += s.msgs
		}
	}
	msgs, err := b.lib.encode()
	if err != nil {
		return nil, fmt.Errorf("encode messages: %w", err)
	}
	if len(msgs) != planned {
		// The count of each step must be exact, or errors would name the
		// wrong message.
		return nil, fmt.Errorf("encode messages: the library made %d messages, %d planned", len(msgs), planned)
	}
	if err := b.putUserData(msgs); err != nil {
		return nil, err
	}
	return msgs, nil
}

// putUserData replaces the user data of the steps that carry their own
// (each a set of one message) in lib, the library's messages of every step.
func (b *batch) putUserData(lib []netlink.Message) error {
	for _, s := range b.steps {
		if s.queue == nil {
			continue
		}
		if s.userData != nil {
			data, err := withUserData(lib[0].Data, s.userData)
			if err != nil {
				return fmt.Errorf("encode %s: %w", s.what, err)
			}
			lib[0].Data = data
		}
		lib = lib[s.msgs:]
	}
	return nil
}

// bufferSize is what the batch takes written: its edges, the library's
// messages lib and every elements step's hint.
func (b *batch) bufferSize(lib []netlink.Message, genID uint32) int {
	size := 2 * batchEdgeSize(genID)
	for _, m := range lib {
		size += nlmsgHeaderLen + align4(len(m.Data))
	}
	for _, s := range b.steps {
		if e := s.elements; e != nil {
			size += e.sizeHint(b.table.Name)
		}
	}
	return size
}

// write writes the batch between its begin and end: the library's messages
// lib copied in their steps' places, set elements encoded in theirs. what
// describes each message between the edges. The messages are numbered from
// 0 as written, to be renumbered once their count is known.
func (b *batch) write(lib []netlink.Message, genID uint32) (*wire, []message, error) {
	w := &wire{buf: make([]byte, 0, b.bufferSize(lib, genID))}
	var what []message
	w.batchEdge(unix.NFNL_MSG_BATCH_BEGIN, genID)
	for _, s := range b.steps {
		if e := s.elements; e != nil {
			err := w.elements(b.family, b.table.Name, e, func(lo, hi int) {
				what = append(what, message{elements: e, lo: lo, hi: hi})
			})
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		for _, m := range lib[:s.msgs] {
			w.message(m)
			what = append(what, message{what: s.what})
		}
		lib = lib[s.msgs:]
	}
	w.batchEdge(unix.NFNL_MSG_BATCH_END, genID)
	return w, what, nil
}

// refusedAt names where a batch failed, for its error, and the error to
// wrap: sending's, or the errno of the message the kernel refused. what
// describes the messages between the batch's edges, numbered from first
// with its begin.
func refusedAt(what []message, first uint32, refused *refusal, err error) (string, error) {
	where := fmt.Sprintf("batch of %d messages", len(what)+2)
	switch {
	case err != nil && errors.Is(err, unix.ENOBUFS):
		return where + "; replies were lost, the kernel may have committed it", err
	case err != nil:
		return where, err
	case refused.errno == unix.ERESTART:
		return where + "; the ruleset changed since it was read", refused.errno
	}
	// The kernel answers a failed commit, and a batch begin it refuses,
	// with the begin's number.
	switch i := refused.seq - first; {
	case i == 0:
		where += "; refused at its begin or in the commit"
	case i <= uint32(len(what)):
		where = fmt.Sprintf("message %d of %d: %s", i, len(what), what[i-1].describe())
	default:
		where += "; refused at its end"
	}
	return where, refused.errno
}

// message says what one message of a written batch does, for errors: a
// step's description, or the elements lo to hi of an elements step.
type message struct {
	what     string
	elements *elementsStep
	lo, hi   int
}

func (m message) describe() string {
	e := m.elements
	if e == nil {
		return m.what
	}
	var el nftmodel.Element
	render := func(i int) string {
		e.src.Element(i, &el)
		return nftmodel.RenderValues(e.enc.key, el.Key)
	}
	return fmt.Sprintf("%s %d elements of set %s (%s … %s)", e.verb(), m.hi-m.lo, e.set.Name, render(m.lo), render(m.hi-1))
}
