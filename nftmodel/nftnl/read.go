package nftnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// ErrNoTable is what Read returns when the table doesn't exist.
var ErrNoTable = errors.New("no such table")

// Read reads the table (family, name) back from the kernel into the model,
// so that Render prints what `nft list table` prints for it, without the nft
// binary: sets and chains in the kernel's order, set elements, rules and
// comments.
//
// Read is Apply's inverse and is checked against it, object by object: a set,
// chain or rule read is declared or encoded again the way Apply writes it,
// and must come out exactly as the kernel holds it. Whatever the model has no
// word for (a kind of set, chain or expression nftproxy doesn't write, or one
// written by hand) fails with an error naming the object, never with a guess;
// a new kind of object must be taught to the model, the applier and then here.
// A table loaded from text with nft may hold another program for the same
// text (nft puts a TCP reset's protocol match first, for one) and is refused
// there.
//
// Elements the packet path added to dynamic sets (session affinity) are not
// model state and are left out; so are their expiry times.
func Read(conn *Conn, family nftmodel.Family, table string) (*nftmodel.Ruleset, error) {
	rs, err := readRuleset(conn, family, table)
	if err != nil {
		return nil, fmt.Errorf("read table %s %s: %w", family, table, err)
	}
	return rs, nil
}

func readRuleset(conn *Conn, family nftmodel.Family, table string) (*nftmodel.Ruleset, error) {
	t := &nftables.Table{Name: table, Family: libFamily(family)}
	if _, err := conn.listTable(table, t.Family); errors.Is(err, unix.ENOENT) {
		return nil, ErrNoTable
	} else if err != nil {
		return nil, fmt.Errorf("get table: %w", err)
	}
	rs := &nftmodel.Ruleset{Family: family, Table: table}
	sets, err := conn.getSets(t)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	var uds map[string][]byte
	anon := map[string]*nftables.Set{}
	for _, ls := range sets {
		ls.Table = t
		if ls.Anonymous {
			anon[ls.Name] = ls
			continue
		}
		if uds == nil {
			if uds, err = setUserData(conn, family, table); err != nil {
				return nil, err
			}
		}
		s, err := readSet(conn, family, ls, uds[ls.Name])
		if err != nil {
			return nil, fmt.Errorf("read set %s: %w", ls.Name, err)
		}
		rs.Sets = append(rs.Sets, s)
	}
	chains, err := conn.listChains(t.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, lc := range chains {
		if lc.Table == nil || lc.Table.Name != table {
			continue
		}
		lc.Table = t
		c, err := readChain(conn, family, lc, anon)
		if err != nil {
			return nil, fmt.Errorf("read chain %s: %w", lc.Name, err)
		}
		rs.Chains = append(rs.Chains, c)
	}
	return rs, nil
}

// readSet reads a named set's declaration and elements.
func readSet(conn *Conn, f nftmodel.Family, ls *nftables.Set, ud []byte) (*nftmodel.Set, error) {
	s, err := modelTypes(ls)
	if err != nil {
		return nil, err
	}
	if s.Typeof, err = readTypeof(f, ud); err != nil {
		return nil, err
	}
	if s.Typeof != nil {
		// The whole user data, as Apply writes it for this declaration.
		want, err := typeofUserData(f, s)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(want, ud) {
			return nil, fmt.Errorf("typeof user data %x, which is not what nftproxy writes for it (%x)", ud, want)
		}
	}
	if ls.HasTimeout {
		s.Timeout = ls.Timeout
		if ls.Size != timeoutSetSize {
			s.Size = ls.Size
		}
	} else {
		s.Size = ls.Size
	}
	if ls.Interval && (!ls.Concatenation || ls.IsMap || ls.HasTimeout) {
		return nil, errors.New("declared with flags, a size or a comment nftproxy doesn't write")
	}
	want, err := libSet(ls.Table, s)
	if err != nil {
		return nil, err
	}
	if !sameSet(ls, want) || ls.Counter || ls.Comment != "" || ls.AutoMerge || ls.DataInterval {
		return nil, errors.New("declared with flags, a size or a comment nftproxy doesn't write")
	}
	if s.Timeout > 0 && !s.IsVerdictMap() {
		return s, nil // dynamic: what is in it, the packet path put there
	}
	els, err := conn.getSetElements(ls)
	if err != nil {
		return nil, fmt.Errorf("get elements: %w", err)
	}
	s.Elements = make([]nftmodel.Element, 0, len(els))
	for _, le := range els {
		e, err := readElement(s, &le)
		if err != nil {
			return nil, err
		}
		s.Elements = append(s.Elements, e)
	}
	return s, nil
}

func readElement(s *nftmodel.Set, le *nftables.SetElement) (nftmodel.Element, error) {
	var e nftmodel.Element
	var err error
	if e.Key, err = readValues(s.Key, le.Key); err != nil {
		return e, fmt.Errorf("read element key: %w", err)
	}
	if le.Timeout != 0 || le.Expires != 0 || le.Counter != nil || le.IntervalEnd || len(le.KeyEnd) > 0 && !s.Interval {
		return e, fmt.Errorf("element %s: has a timeout, counter or interval nftproxy doesn't write", nftmodel.RenderValues(s.Key, e.Key))
	}
	if s.Interval {
		// nft and Apply send a single key as a range of one.
		if len(le.KeyEnd) == 0 {
			return e, fmt.Errorf("element %s: no end in an interval set", nftmodel.RenderValues(s.Key, e.Key))
		}
		if !bytes.Equal(le.KeyEnd, le.Key) {
			if e.KeyEnd, err = readValues(s.Key, le.KeyEnd); err != nil {
				return e, fmt.Errorf("read element end: %w", err)
			}
		}
	}
	e.Comment = le.Comment
	switch {
	case s.IsVerdictMap():
		lv, err := elementVerdict(le)
		if err != nil {
			return e, fmt.Errorf("element %s: %w", nftmodel.RenderValues(s.Key, e.Key), err)
		}
		v, err := readVerdict(lv)
		if err != nil {
			return e, fmt.Errorf("element %s: %w", nftmodel.RenderValues(s.Key, e.Key), err)
		}
		e.Verdict = &v
	case len(s.Data) > 0:
		if e.Data, err = readValues(s.Data, le.Val); err != nil {
			return e, fmt.Errorf("element %s: read value: %w", nftmodel.RenderValues(s.Key, e.Key), err)
		}
	}
	return e, nil
}

// readValues decodes KeyBytes: it must encode back to exactly b.
func readValues(types []nftmodel.DataType, b []byte) ([]nftmodel.Value, error) {
	vals := make([]nftmodel.Value, len(types))
	off := 0
	for i, t := range types {
		n := nftmodel.KeyLen(types[i : i+1])
		if off+n > len(b) {
			return nil, fmt.Errorf("%d bytes %x are too short for %s", len(b), b, nftmodel.RenderTypes(types))
		}
		switch t {
		case nftmodel.TypeIPv4Addr, nftmodel.TypeIPv6Addr:
			vals[i].Addr, _ = netip.AddrFromSlice(b[off : off+n])
		case nftmodel.TypeInetProto:
			vals[i].Num = uint32(b[off])
		case nftmodel.TypeInetService:
			vals[i].Num = uint32(binary.BigEndian.Uint16(b[off:]))
		case nftmodel.TypeInteger:
			vals[i].Num = hostEndian.Uint32(b[off:])
		default:
			return nil, fmt.Errorf("type %s can't be a key or a value's part", nftmodel.RenderTypes(types[i:i+1]))
		}
		off += n
		if len(types) > 1 {
			off = (off + 3) &^ 3
		}
	}
	if !bytes.Equal(nftmodel.KeyBytes(types, vals), b) {
		return nil, fmt.Errorf("bytes %x are not a %s", b, nftmodel.RenderTypes(types))
	}
	return vals, nil
}

// elementVerdict decodes a verdict map element's verdict. google/nftables
// leaves it encoded in Val when it reads elements: the nested attributes of
// NFTA_DATA_VERDICT, a code and for jumps and gotos a chain.
func elementVerdict(le *nftables.SetElement) (*expr.Verdict, error) {
	if le.VerdictData != nil {
		return le.VerdictData, nil
	}
	ad, err := netlink.NewAttributeDecoder(le.Val)
	if err != nil {
		return nil, fmt.Errorf("decode verdict: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	v := &expr.Verdict{}
	code := false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind, code = expr.VerdictKind(int32(ad.Uint32())), true
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	if err := ad.Err(); err != nil || !code {
		return nil, fmt.Errorf("decode verdict %x: no verdict code (%v)", le.Val, err)
	}
	return v, nil
}

func readVerdict(v *expr.Verdict) (nftmodel.Verdict, error) {
	switch v.Kind {
	case expr.VerdictAccept:
		return nftmodel.Verdict{Kind: nftmodel.Accept}, nil
	case expr.VerdictDrop:
		return nftmodel.Verdict{Kind: nftmodel.Drop}, nil
	case expr.VerdictReturn:
		return nftmodel.Verdict{Kind: nftmodel.Return}, nil
	case expr.VerdictJump:
		return nftmodel.Verdict{Kind: nftmodel.Jump, Chain: v.Chain}, nil
	case expr.VerdictGoto:
		return nftmodel.Verdict{Kind: nftmodel.Goto, Chain: v.Chain}, nil
	}
	return nftmodel.Verdict{}, fmt.Errorf("verdict %d is not in the model", v.Kind)
}

var modelHooks = map[nftables.ChainHook]nftmodel.Hook{
	*nftables.ChainHookPrerouting:  nftmodel.HookPrerouting,
	*nftables.ChainHookInput:       nftmodel.HookInput,
	*nftables.ChainHookForward:     nftmodel.HookForward,
	*nftables.ChainHookOutput:      nftmodel.HookOutput,
	*nftables.ChainHookPostrouting: nftmodel.HookPostrouting,
}

func readChain(conn *Conn, f nftmodel.Family, lc *nftables.Chain, anon map[string]*nftables.Set) (*nftmodel.Chain, error) {
	c := &nftmodel.Chain{Name: lc.Name}
	if lc.Hooknum != nil {
		h, ok := modelHooks[*lc.Hooknum]
		if !ok || lc.Priority == nil {
			return nil, fmt.Errorf("hook %d is not in the model", *lc.Hooknum)
		}
		c.Base = &nftmodel.BaseChain{Type: nftmodel.TypeFilter, Hook: h, Priority: int32(*lc.Priority)}
		switch lc.Type {
		case nftables.ChainTypeFilter:
		case nftables.ChainTypeNAT:
			c.Base.Type = nftmodel.TypeNAT
		default:
			return nil, fmt.Errorf("chain type %q is not in the model", lc.Type)
		}
	}
	if !sameChain(lc, c) {
		return nil, errors.New("a base chain nftproxy doesn't write (policy)")
	}
	rules, err := conn.getRules(lc.Table, lc)
	if err != nil {
		return nil, fmt.Errorf("get rules: %w", err)
	}
	for i, lr := range rules {
		r, err := readRule(conn, f, lr, anon)
		if err != nil {
			return nil, fmt.Errorf("read rule %d: %w", i+1, err)
		}
		c.Rules = append(c.Rules, r)
	}
	return c, nil
}

// readRule decodes a rule's expressions, then encodes the result as Apply
// would and requires the kernel's expressions back, byte for byte.
func readRule(conn *Conn, f nftmodel.Family, lr *nftables.Rule, anon map[string]*nftables.Set) (nftmodel.Rule, error) {
	var r nftmodel.Rule
	if len(lr.UserData) > 0 {
		comment, ok := userdata.GetString(lr.UserData, userdata.TypeComment)
		if !ok || !bytes.Equal(userdata.AppendString(nil, userdata.TypeComment, comment), lr.UserData) {
			return r, errors.New("user data other than a comment")
		}
		r.Comment = comment
	}
	d := &ruleDecoder{f: f, in: lr.Exprs, conn: conn, anon: anon}
	for d.i < len(d.in) {
		e, n, err := d.next()
		if err != nil {
			return r, fmt.Errorf("expression %d (%s): %w", d.i+1, exprName(d.in[d.i]), err)
		}
		r.Exprs = append(r.Exprs, e)
		d.i += n
	}
	encoded, _, err := ruleExprs(f, r)
	if err != nil {
		return r, fmt.Errorf("encode %q again: %w", nftmodel.RenderRule(f, r), err)
	}
	// Lookups into anonymous maps get their set when the batch is built:
	// they are the kernel's, in order.
	var anonNames []string
	for _, e := range lr.Exprs {
		if l, ok := e.(*expr.Lookup); ok && anon[l.SetName] != nil {
			anonNames = append(anonNames, l.SetName)
		}
	}
	for _, e := range encoded {
		if l, ok := e.(*expr.Lookup); ok && l.SetName == "" && len(anonNames) > 0 {
			l.SetName, anonNames = anonNames[0], anonNames[1:]
		}
	}
	if !sameExprs(f, encoded, lr.Exprs) {
		return r, fmt.Errorf("read as %q, which encodes differently from the kernel's rule", nftmodel.RenderRule(f, r))
	}
	return r, nil
}

// sameExprs compares encoded expressions with those read from the kernel,
// whose decoding by google/nftables drops what it doesn't know: of what
// ruleExprs writes, the byte order conversion of numgen.
func sameExprs(f nftmodel.Family, a, b []expr.Any) bool {
	a = slices.DeleteFunc(slices.Clone(a), func(e expr.Any) bool {
		_, ok := e.(*expr.Byteorder)
		return ok
	})
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, errx := expr.Marshal(byte(libFamily(f)), kernelForm(a[i]))
		y, erry := expr.Marshal(byte(libFamily(f)), kernelForm(b[i]))
		if errx != nil || erry != nil || !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}

// kernelForm fills in what the kernel does when it stores an expression (a
// NAT range's maximum registers default to the minimum ones) and what nft
// lists the same either way (a port from a register is "specified" whether
// or not the flag says so: nft sets it, nftproxy doesn't).
func kernelForm(e expr.Any) expr.Any {
	if n, ok := e.(*expr.NAT); ok {
		c := *n
		if c.RegAddrMax == 0 {
			c.RegAddrMax = c.RegAddrMin
		}
		if c.RegProtoMax == 0 {
			c.RegProtoMax = c.RegProtoMin
		}
		c.Specified = c.Specified || c.RegProtoMin != 0
		return &c
	}
	return e
}

func exprName(e expr.Any) string { return fmt.Sprintf("%T", e)[len("*expr."):] }

// ruleDecoder turns a rule's register program back into model expressions.
// Each step recognises the program ruleExprs writes for one model expression
// and takes its parameters; it need not check every detail (registers,
// lengths), since readRule encodes the result again and compares.
type ruleDecoder struct {
	f    nftmodel.Family
	in   []expr.Any
	i    int
	l4   bool // an earlier expression matched the layer 4 protocol
	conn *Conn
	anon map[string]*nftables.Set
}

// at returns the expression n places after the current one, nil past the end.
func (d *ruleDecoder) at(n int) expr.Any {
	if d.i+n < len(d.in) {
		return d.in[d.i+n]
	}
	return nil
}

var errUnknown = errors.New("no model expression writes this")

// next decodes the model expression starting at the current position and
// says how many kernel expressions it covers.
func (d *ruleDecoder) next() (nftmodel.Expr, int, error) {
	if fields, n := d.keyLoads(); n > 0 {
		if e, m, ok := d.keyed(fields, n); ok {
			return e, m, nil
		}
	}
	switch e := d.at(0).(type) {
	case *expr.Payload:
		return d.prefix(e)
	case *expr.Counter:
		return nftmodel.Counter{Packets: e.Packets, Bytes: e.Bytes}, 1, nil
	case *expr.Meta:
		switch {
		case e.Key == expr.MetaKeyL4PROTO:
			return d.l4proto()
		case e.Key == expr.MetaKeyMARK && !e.SourceRegister:
			return d.mark()
		case e.Key == expr.MetaKeyIIFNAME && !e.SourceRegister:
			return d.iifname()
		}
	case *expr.Fib:
		if _, ok := d.at(1).(*expr.Cmp); ok {
			if e.FlagSADDR {
				return nftmodel.MatchFibSaddrLocal{}, 2, nil
			}
			return nftmodel.MatchFibDaddrLocal{}, 2, nil
		}
	case *expr.Ct:
		bw, okB := d.at(1).(*expr.Bitwise)
		cmp, okC := d.at(2).(*expr.Cmp)
		if !okB || !okC || len(bw.Mask) != 4 {
			break
		}
		// bitTest: "!= 0" tests that a bit is set, "== 0" that none is.
		negate := cmp.Op == expr.CmpOpEq
		switch mask := hostEndian.Uint32(bw.Mask); {
		case e.Key == expr.CtKeySTATE && mask == expr.CtStateBitINVALID:
			return nftmodel.MatchCtStateInvalid{}, 3, nil
		case e.Key == expr.CtKeySTATE:
			return nftmodel.MatchCtStateEstablished{Negate: negate}, 3, nil
		case e.Key == expr.CtKeySTATUS:
			return nftmodel.MatchCtStatusDNAT{Negate: negate}, 3, nil
		}
	case *expr.Numgen:
		return d.numgen(e)
	case *expr.Masq:
		return nftmodel.Masquerade{FullyRandom: e.FullyRandom}, 1, nil
	case *expr.Reject:
		return nftmodel.Reject{TCPReset: e.Type == unix.NFT_REJECT_TCP_RST}, 1, nil
	case *expr.Verdict:
		v, err := readVerdict(e)
		return v, 1, err
	}
	return nil, 0, errUnknown
}

// keyLoads reads the loads of a (concatenated) key into consecutive
// registers starting at register 1, as loadKey writes them.
func (d *ruleDecoder) keyLoads() ([]nftmodel.Field, int) {
	var fields []nftmodel.Field
	var offset uint32
	for n := 0; ; n++ {
		var fl nftmodel.Field
		switch e := d.at(n).(type) {
		case *expr.Payload:
			switch {
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2:
				fl = nftmodel.FieldTHDport
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == addrOffset(d.f, nftmodel.FieldSaddr):
				fl = nftmodel.FieldSaddr
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == addrOffset(d.f, nftmodel.FieldDaddr):
				fl = nftmodel.FieldDaddr
			default:
				return fields, n
			}
			if e.DestRegister != reg(offset) {
				return fields, n
			}
		case *expr.Meta:
			if e.Key != expr.MetaKeyL4PROTO || e.SourceRegister || e.Register != reg(offset) {
				return fields, n
			}
			fl = nftmodel.FieldL4Proto
		case *expr.Ct:
			var ok bool
			if fl, ok = ctField(e); !ok || e.SourceRegister || e.Register != reg(offset) {
				return fields, n
			}
		default:
			return fields, n
		}
		_, size := loadField(d.f, fl, offset)
		offset += (size + 3) / 4
		fields = append(fields, fl)
	}
}

// keyed decodes the expressions that look a loaded key up: set match,
// verdict map, DNAT map and set update.
func (d *ruleDecoder) keyed(key []nftmodel.Field, n int) (nftmodel.Expr, int, bool) {
	switch e := d.at(n).(type) {
	case *expr.Lookup:
		switch {
		case !e.IsDestRegSet:
			return nftmodel.MatchSet{Key: key, Set: e.SetName, Negate: e.Invert}, n + 1, true
		case e.DestRegister == 0:
			return nftmodel.VerdictMap{Key: key, Map: e.SetName}, n + 1, true
		}
		if _, ok := d.at(n + 1).(*expr.NAT); ok {
			return nftmodel.DNATMap{Key: key, Map: e.SetName}, n + 2, true
		}
	case *expr.Numgen:
		// A DNAT map keyed with a random slot after the fields.
		l, okL := d.at(n + 1).(*expr.Lookup)
		_, okN := d.at(n + 2).(*expr.NAT)
		if okL && okN && l.IsDestRegSet && l.DestRegister != 0 {
			return nftmodel.DNATMap{Key: key, Numgen: e.Modulus, Offset: e.Offset, Map: l.SetName}, n + 3, true
		}
	case *expr.Dynset:
		if e.SrcRegData != 0 {
			return d.updateMap(key, e, n)
		}
		return nftmodel.UpdateSet{Key: key, Set: e.SetName}, n + 1, true
	}
	return nil, 0, false
}

// prefix decodes an address match: a whole address, the whole bytes of a
// byte-aligned prefix, or a masked address.
func (d *ruleDecoder) prefix(p *expr.Payload) (nftmodel.Expr, int, error) {
	m := nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr}
	if p.Offset == addrOffset(d.f, nftmodel.FieldSaddr) {
		m.Field = nftmodel.FieldSaddr
	}
	n := 1
	bitLen := int(p.Len * 8)
	if bw, ok := d.at(1).(*expr.Bitwise); ok {
		bitLen = 0
		for _, b := range bw.Mask {
			bitLen += bits.OnesCount8(b)
		}
		n++
	}
	cmp, ok := d.at(n).(*expr.Cmp)
	if !ok {
		return nil, 0, errUnknown
	}
	addr := make([]byte, addrLen(d.f))
	copy(addr, cmp.Data)
	a, _ := netip.AddrFromSlice(addr)
	m.Prefix = netip.PrefixFrom(a, bitLen)
	m.Negate = cmp.Op == expr.CmpOpNeq
	return m, n + 1, nil
}

// l4proto decodes a protocol match, and the two expressions whose program
// starts with one: a DNAT to an address and port, and a TCP reset in a rule
// that matched no protocol before (nft adds that match and doesn't list it).
func (d *ruleDecoder) l4proto() (nftmodel.Expr, int, error) {
	cmp, ok := d.at(1).(*expr.Cmp)
	if !ok || len(cmp.Data) != 1 {
		return nil, 0, errUnknown
	}
	proto := cmp.Data[0]
	addr, okA := d.at(2).(*expr.Immediate)
	port, okP := d.at(3).(*expr.Immediate)
	_, okN := d.at(4).(*expr.NAT)
	if okA && okP && okN && len(port.Data) == 2 {
		a, _ := netip.AddrFromSlice(addr.Data)
		d.l4 = true
		return nftmodel.DNAT{Proto: proto, Addr: a, Port: binary.BigEndian.Uint16(port.Data)}, 5, nil
	}
	if rej, ok := d.at(2).(*expr.Reject); ok && !d.l4 && proto == unix.IPPROTO_TCP && rej.Type == unix.NFT_REJECT_TCP_RST {
		d.l4 = true
		return nftmodel.Reject{TCPReset: true}, 3, nil
	}
	d.l4 = true
	return nftmodel.MatchL4Proto{Proto: proto}, 2, nil
}

// iifname decodes an input interface name match: the name padded with NULs
// to IFNAMSIZ, or a prefix's bytes alone for "prefix*".
func (d *ruleDecoder) iifname() (nftmodel.Expr, int, error) {
	cmp, ok := d.at(1).(*expr.Cmp)
	if !ok || len(cmp.Data) == 0 {
		return nil, 0, errUnknown
	}
	name := string(cmp.Data) + "*"
	if len(cmp.Data) == ifNameSize {
		name = string(bytes.TrimRight(cmp.Data, "\x00"))
	}
	return nftmodel.MatchIifname{Name: name, Negate: cmp.Op == expr.CmpOpNeq}, 2, nil
}

// mark decodes a mark test (load, mask, compare) and a mark change (load,
// mask and xor, store).
func (d *ruleDecoder) mark() (nftmodel.Expr, int, error) {
	bw, ok := d.at(1).(*expr.Bitwise)
	if !ok || len(bw.Mask) != 4 || len(bw.Xor) != 4 {
		return nil, 0, errUnknown
	}
	mask, xor := hostEndian.Uint32(bw.Mask), hostEndian.Uint32(bw.Xor)
	switch e := d.at(2).(type) {
	case *expr.Cmp:
		return nftmodel.MatchMark{Mask: mask, IsSet: e.Op == expr.CmpOpNeq}, 3, nil
	case *expr.Meta:
		if mask == 0xffffffff {
			return nftmodel.MarkXor{Bits: xor}, 3, nil
		}
		return nftmodel.MarkOr{Bits: xor}, 3, nil
	}
	return nil, 0, errUnknown
}

// numgen decodes `numgen random mod N vmap { 0 : goto a, … }`: its anonymous
// map must hold exactly the keys 0 to N-1, each going to a chain.
func (d *ruleDecoder) numgen(ng *expr.Numgen) (nftmodel.Expr, int, error) {
	// google/nftables doesn't decode the byte order conversion between the
	// two: it is not in the rule as read.
	l, ok := d.at(1).(*expr.Lookup)
	if !ok {
		return nil, 0, errUnknown
	}
	if _, ok := d.at(2).(*expr.NAT); ok && l.IsDestRegSet && l.DestRegister != 0 {
		// A DNAT map keyed with the random slot alone.
		return nftmodel.DNATMap{Numgen: ng.Modulus, Offset: ng.Offset, Map: l.SetName}, 3, nil
	}
	ls := d.anon[l.SetName]
	if ls == nil {
		return nil, 0, fmt.Errorf("lookup in %s, not an anonymous map of the table", l.SetName)
	}
	if !ls.IsMap || ls.DataType.GetNFTMagic() != nftables.TypeVerdict.GetNFTMagic() ||
		ls.KeyType.GetNFTMagic() != nftables.TypeInteger.GetNFTMagic() {
		return nil, 0, fmt.Errorf("anonymous set %s is not an integer-keyed verdict map", l.SetName)
	}
	els, err := d.conn.getSetElements(ls)
	if err != nil {
		return nil, 0, fmt.Errorf("get elements of %s: %w", l.SetName, err)
	}
	// Keys are big-endian as nftproxy writes them, host-endian as nft does.
	for _, order := range []binary.ByteOrder{binary.BigEndian, hostEndian} {
		if chains, ok := numgenChains(els, ng.Modulus, order); ok {
			return nftmodel.NumgenGoto{Chains: chains}, 2, nil
		}
	}
	return nil, 0, fmt.Errorf("anonymous map %s is not `numgen random mod %d vmap { 0 : goto …, … }`", l.SetName, ng.Modulus)
}

// numgenChains reads the chains of keys 0 to n-1, each there once, in els.
func numgenChains(els []nftables.SetElement, n uint32, order binary.ByteOrder) ([]string, bool) {
	chains := make([]string, n)
	for _, e := range els {
		v, err := elementVerdict(&e)
		if err != nil || len(e.Key) != 4 || v.Kind != expr.VerdictGoto {
			return nil, false
		}
		i := order.Uint32(e.Key)
		if i >= n || chains[i] != "" {
			return nil, false
		}
		chains[i] = v.Chain
	}
	return chains, !slices.Contains(chains, "")
}

// ctField is the field a conntrack load reads, if it is one of the model's.
func ctField(e *expr.Ct) (nftmodel.Field, bool) {
	switch {
	case (e.Key == expr.CtKeyDSTIP || e.Key == expr.CtKeyDSTIP6) && e.Direction == 0:
		return nftmodel.FieldCtOriginalDaddr, true
	case e.Key == expr.CtKeyPROTODST && e.Direction == 0:
		return nftmodel.FieldCtOriginalProtoDst, true
	case (e.Key == expr.CtKeySRCIP || e.Key == expr.CtKeySRCIP6) && e.Direction == ctDirReply:
		return nftmodel.FieldCtReplySaddr, true
	case e.Key == expr.CtKeyPROTOSRC && e.Direction == ctDirReply:
		return nftmodel.FieldCtReplyProtoSrc, true
	}
	return 0, false
}

// updateMap decodes an UpdateMap: of the fields loaded, those from the
// dynset's data register on are the value.
func (d *ruleDecoder) updateMap(fields []nftmodel.Field, e *expr.Dynset, n int) (nftmodel.Expr, int, bool) {
	var words uint32
	for i, fl := range fields {
		if reg(words) == e.SrcRegData {
			return nftmodel.UpdateMap{Key: fields[:i], Data: fields[i:], Map: e.SetName, Timeout: e.Timeout}, n + 1, true
		}
		_, size := loadField(d.f, fl, words)
		words += (size + 3) / 4
	}
	return nil, 0, false
}
