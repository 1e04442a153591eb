package nftmodel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Render prints rs in nft syntax, exactly as `nft list table` prints the table
// after the same ruleset has been applied: sets first, then chains, each in
// model order; elements in the order nft sorts them.
func Render(rs *Ruleset) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", rs.Family, rs.Table)
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, s := range rs.Sets {
		sep()
		renderSet(&b, rs.Family, s)
	}
	for _, c := range rs.Chains {
		sep()
		renderChain(&b, rs.Family, c)
	}
	b.WriteString("}\n")
	return b.String()
}

func renderSet(b *strings.Builder, f Family, s *Set) {
	kind := "set"
	if len(s.Data) > 0 {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n", kind, s.Name)
	switch {
	case s.Typeof != nil:
		fmt.Fprintf(b, "\t\ttypeof %s", keyExprs(f, s.Typeof.Key, s.Typeof.KeyNumgen))
		if len(s.Typeof.Data) > 0 {
			fmt.Fprintf(b, " : %s", fieldsName(f, s.Typeof.Data))
		}
	default:
		fmt.Fprintf(b, "\t\ttype %s", RenderTypes(s.Key))
		if len(s.Data) > 0 {
			fmt.Fprintf(b, " : %s", RenderTypes(s.Data))
		}
	}
	b.WriteString("\n")
	if s.Timeout == 0 && s.Size > 0 {
		fmt.Fprintf(b, "\t\tsize %d\n", s.Size)
	}
	if s.Interval {
		b.WriteString("\t\tflags interval\n")
	}
	if s.Timeout > 0 {
		fmt.Fprintf(b, "\t\tsize %d\n\t\tflags dynamic,timeout\n", s.DeclaredSize())
		fmt.Fprintf(b, "\t\ttimeout %s\n", formatDuration(s.Timeout))
	}
	if s.Len() > 0 {
		b.WriteString("\t\telements = { ")
		perLine := elementsPerLine(s.Key)
		for i, e := range SortedElements(s) {
			switch {
			case i == 0:
			case i%perLine == 0:
				b.WriteString(",\n\t\t\t     ")
			default:
				b.WriteString(", ")
			}
			b.WriteString(renderElement(s, e))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

// elementsPerLine is how many elements nft 1.0.6 prints on one line: it
// depends on the key's size (measured: ports and protocols 5, IPv4
// addresses 2, wider keys and concatenations 1).
func elementsPerLine(key []DataType) int {
	if len(key) == 1 {
		switch key[0] {
		case TypeInetService, TypeInetProto:
			return 5
		case TypeIPv4Addr:
			return 2
		}
	}
	return 1
}

func renderElement(s *Set, e Element) string {
	var b strings.Builder
	if e.KeyEnd != nil {
		b.WriteString(RenderRange(s.Key, e.Key, e.KeyEnd))
	} else {
		b.WriteString(RenderValues(s.Key, e.Key))
	}
	if e.Comment != "" {
		fmt.Fprintf(&b, " comment %q", e.Comment)
	}
	switch {
	case e.Verdict != nil:
		b.WriteString(" : " + renderVerdict(*e.Verdict))
	case len(s.Data) > 0:
		b.WriteString(" : " + RenderValues(s.Data, e.Data))
	}
	return b.String()
}

// RenderValues prints a key or value as nft lists it: its parts joined by " . ".
func RenderValues(types []DataType, vals []Value) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = renderValue(types[i], v)
	}
	return strings.Join(parts, " . ")
}

// RenderRange prints an interval set's element from lo to hi as nft lists
// it: each part one value where both ends agree, else a prefix where the
// addresses span exactly one, else lo-hi.
func RenderRange(types []DataType, lo, hi []Value) string {
	parts := make([]string, len(lo))
	for i := range lo {
		switch {
		case lo[i] == hi[i]:
			parts[i] = renderValue(types[i], lo[i])
		case lo[i].Addr.IsValid():
			if p, ok := RangePrefix(lo[i].Addr, hi[i].Addr); ok {
				parts[i] = p.String()
			} else {
				parts[i] = lo[i].Addr.String() + "-" + hi[i].Addr.String()
			}
		default:
			parts[i] = renderValue(types[i], lo[i]) + "-" + renderValue(types[i], hi[i])
		}
	}
	return strings.Join(parts, " . ")
}

// RangePrefix returns the prefix holding exactly the addresses lo to hi,
// if there is one.
func RangePrefix(lo, hi netip.Addr) (netip.Prefix, bool) {
	for bits := 0; bits <= lo.BitLen(); bits++ {
		p := netip.PrefixFrom(lo, bits)
		if p.Masked().Addr() == lo && LastAddr(p) == hi {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// LastAddr is the highest address of a prefix.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func renderValue(t DataType, v Value) string {
	switch t {
	case TypeIPv4Addr, TypeIPv6Addr:
		return v.Addr.String()
	case TypeInetProto:
		return protoName(uint8(v.Num))
	default:
		return fmt.Sprint(v.Num)
	}
}

// RenderTypes prints a key or value type as nft declares it.
func RenderTypes(ts []DataType) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = [...]string{"ipv4_addr", "ipv6_addr", "inet_proto", "inet_service", "verdict", "integer"}[t]
	}
	return strings.Join(parts, " . ")
}

// SortedElements returns the set's elements in the order nft lists them
// (see SortElements), leaving the set as it is.
func SortedElements(s *Set) []Element {
	c := *s
	c.Elements, c.Source = slices.Clone(s.All()), nil
	SortElements(&c)
	return c.Elements
}

// SortElements sorts the set's elements in place into the order nft lists
// them: single values by numeric value, concatenations by their padded key
// bytes compared from the last byte to the first (nft sorts concatenations
// as one little-endian number). Equal keys keep their order. It allocates
// the keys in one array and a permutation, not a copy of the elements: at
// 400,000 elements a compile is otherwise mostly sorting garbage.
func SortElements(s *Set) {
	els := s.Elements
	n := len(els)
	if n < 2 {
		return
	}
	stride := max(KeyLen(s.Key), 1)
	keys := make([]byte, n*stride)
	for i := range els {
		k := keys[i*stride : (i+1)*stride : (i+1)*stride]
		// An element of the wrong shape (refused when applied) sorts by
		// what of its key fits.
		copy(k, AppendKeyBytes(k[:0], s.Key, els[i].Key))
		if len(s.Key) > 1 {
			slices.Reverse(k)
		}
	}
	key := func(i int32) []byte { return keys[int(i)*stride : int(i+1)*stride] }
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return bytes.Compare(key(a), key(b)) })
	// els[i] must become the old els[order[i]]: follow each cycle of the
	// permutation once, marking done positions with -1.
	for i := range order {
		if order[i] < 0 {
			continue
		}
		tmp, j := els[i], i
		for {
			k := int(order[j])
			order[j] = -1
			if k == i {
				els[j] = tmp
				break
			}
			els[j] = els[k]
			j = k
		}
	}
}

// KeyBytes encodes values as the kernel stores them: each part in network
// byte order, padded to a multiple of 4 bytes when the key is a concatenation.
func KeyBytes(types []DataType, vals []Value) []byte {
	return AppendKeyBytes(nil, types, vals)
}

// KeyLen is the length KeyBytes gives values of the types.
func KeyLen(ts []DataType) int {
	n := 0
	for _, t := range ts {
		switch t {
		case TypeIPv4Addr:
			n += 4
		case TypeIPv6Addr:
			n += 16
		case TypeInetProto:
			n++
		case TypeInetService:
			n += 2
		case TypeInteger:
			n += 4
		}
		if len(ts) > 1 {
			n = (n + 3) &^ 3
		}
	}
	return n
}

// AppendKeyBytes appends KeyBytes(types, vals) to b.
func AppendKeyBytes(b []byte, types []DataType, vals []Value) []byte {
	start := len(b)
	for i, t := range types {
		switch t {
		case TypeIPv4Addr, TypeIPv6Addr:
			switch a := vals[i].Addr; {
			case a.Is4():
				v := a.As4()
				b = append(b, v[:]...)
			case a.IsValid():
				v := a.As16()
				b = append(b, v[:]...)
			}
		case TypeInetProto:
			b = append(b, byte(vals[i].Num))
		case TypeInetService:
			b = append(b, byte(vals[i].Num>>8), byte(vals[i].Num))
		case TypeInteger:
			b = binary.NativeEndian.AppendUint32(b, vals[i].Num)
		}
		if len(types) > 1 {
			for (len(b)-start)%4 != 0 {
				b = append(b, 0)
			}
		}
	}
	return b
}

func renderChain(b *strings.Builder, f Family, c *Chain) {
	fmt.Fprintf(b, "\tchain %s {\n", c.Name)
	if c.Base != nil {
		fmt.Fprintf(b, "\t\ttype %s hook %s priority %s; policy accept;\n", c.Base.Type, c.Base.Hook, priorityName(c.Base))
	}
	for _, r := range c.Rules {
		b.WriteString("\t\t" + RenderRule(f, r) + "\n")
	}
	b.WriteString("\t}\n")
}

// priorityName prints a priority the way nft 1.0.6 does: by the first
// standard priority within 10 of it, as that name plus or minus the offset,
// unless that name belongs to another hook (dstnat is prerouting's, srcnat
// postrouting's); then, and when no name is near, as the number.
func priorityName(bc *BaseChain) string {
	std := []struct {
		name string
		prio int32
		only Hook // the one hook the name is valid for, if restricted
		any  bool
	}{
		{"raw", -300, 0, true},
		{"mangle", -150, 0, true},
		{"dstnat", -100, HookPrerouting, false},
		{"filter", 0, 0, true},
		{"security", 50, 0, true},
		{"srcnat", 100, HookPostrouting, false},
	}
	for _, s := range std {
		off := bc.Priority - s.prio
		if off < -10 || off > 10 {
			continue
		}
		if !s.any && bc.Hook != s.only {
			break
		}
		switch {
		case off > 0:
			return fmt.Sprintf("%s + %d", s.name, off)
		case off < 0:
			return fmt.Sprintf("%s - %d", s.name, -off)
		}
		return s.name
	}
	return fmt.Sprint(bc.Priority)
}

// RenderRule prints one rule as nft lists it.
func RenderRule(f Family, r Rule) string {
	parts := make([]string, 0, len(r.Exprs)+1)
	for _, e := range r.Exprs {
		parts = append(parts, renderExpr(f, e))
	}
	if r.Comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(parts, " ")
}

func renderExpr(f Family, e Expr) string {
	switch e := e.(type) {
	case MatchPrefix:
		op := ""
		if e.Negate {
			op = "!= "
		}
		return fmt.Sprintf("%s %s%s", fieldName(f, e.Field), op, prefixString(e.Prefix))
	case MatchL4Proto:
		return "meta l4proto " + protoName(e.Proto)
	case MatchMark:
		op := "=="
		if e.IsSet {
			op = "!="
		}
		return fmt.Sprintf("meta mark & 0x%08x %s 0x00000000", e.Mask, op)
	case MatchFibDaddrLocal:
		return "fib daddr type local"
	case MatchFibSaddrLocal:
		return "fib saddr type local"
	case UpdateSet:
		return fmt.Sprintf("update @%s { %s }", e.Set, fieldsName(f, e.Key))
	case UpdateMap:
		return renderUpdateMap(f, e)
	case MatchCtStateInvalid:
		return "ct state invalid"
	case Counter:
		return fmt.Sprintf("counter packets %d bytes %d", e.Packets, e.Bytes)
	case MatchCtStatusDNAT:
		if e.Negate {
			return "ct status ! dnat"
		}
		return "ct status dnat"
	case MatchCtStateEstablished:
		if e.Negate {
			return "ct state ! established,related"
		}
		return "ct state established,related"
	case MatchIifname:
		op := ""
		if e.Negate {
			op = "!= "
		}
		return fmt.Sprintf("iifname %s%q", op, e.Name)
	case MatchSet:
		if e.Negate {
			return fmt.Sprintf("%s != @%s", fieldsName(f, e.Key), e.Set)
		}
		return fmt.Sprintf("%s @%s", fieldsName(f, e.Key), e.Set)
	case VerdictMap:
		return fmt.Sprintf("%s vmap @%s", fieldsName(f, e.Key), e.Map)
	case NumgenGoto:
		els := make([]string, len(e.Chains))
		for i, c := range e.Chains {
			els[i] = fmt.Sprintf("%d : goto %s", i, c)
		}
		return fmt.Sprintf("numgen random mod %d vmap { %s }", len(e.Chains), strings.Join(els, ", "))
	case MarkOr:
		return fmt.Sprintf("meta mark set meta mark | 0x%08x", e.Bits)
	case MarkXor:
		return fmt.Sprintf("meta mark set meta mark ^ 0x%08x", e.Bits)
	case DNATMap:
		return fmt.Sprintf("dnat %s to %s%s map @%s", f, keyExprs(f, e.Key, e.Numgen), numgenOffset(e.Offset), e.Map)
	case DNAT:
		return fmt.Sprintf("meta l4proto %s dnat to %s", protoName(e.Proto), netip.AddrPortFrom(e.Addr, e.Port))
	case Masquerade:
		if e.FullyRandom {
			return "masquerade fully-random"
		}
		return "masquerade"
	case Reject:
		if e.TCPReset {
			return "reject with tcp reset"
		}
		return "reject"
	case Verdict:
		return renderVerdict(e)
	}
	panic(fmt.Sprintf("nftmodel: unknown expression %T", e))
}

func renderVerdict(v Verdict) string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	default:
		return "goto " + v.Chain
	}
}

func fieldName(f Family, fl Field) string {
	switch fl {
	case FieldSaddr:
		return f.String() + " saddr"
	case FieldDaddr:
		return f.String() + " daddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldCtOriginalDaddr:
		return "ct original " + f.String() + " daddr"
	case FieldCtOriginalProtoDst:
		return "ct original proto-dst"
	case FieldCtReplySaddr:
		return "ct reply " + f.String() + " saddr"
	case FieldCtReplyProtoSrc:
		return "ct reply proto-src"
	default:
		return "th dport"
	}
}

func fieldsName(f Family, fs []Field) string {
	parts := make([]string, len(fs))
	for i, fl := range fs {
		parts[i] = fieldName(f, fl)
	}
	return strings.Join(parts, " . ")
}

// keyExprs prints a key of fields, ending in numgen when numgen > 0.
func keyExprs(f Family, fs []Field, numgen uint32) string {
	parts := make([]string, 0, len(fs)+1)
	for _, fl := range fs {
		parts = append(parts, fieldName(f, fl))
	}
	if numgen > 0 {
		parts = append(parts, fmt.Sprintf("numgen random mod %d", numgen))
	}
	return strings.Join(parts, " . ")
}

func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// formatDuration prints a duration like nft: 3h, 1h30m, 10s, 1d2h.
func formatDuration(d time.Duration) string {
	var b strings.Builder
	units := []struct {
		suffix string
		size   time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}}
	for _, u := range units {
		if n := d / u.size; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.suffix)
			d -= n * u.size
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}

// numgenOffset renders a numgen's offset; none when 0, as nft lists it.
func numgenOffset(off uint32) string {
	if off == 0 {
		return ""
	}
	return fmt.Sprintf(" offset %d", off)
}

// renderUpdateMap renders an UpdateMap as nft lists it.
func renderUpdateMap(f Family, e UpdateMap) string {
	return fmt.Sprintf("update @%s { %s timeout %s : %s }", e.Map, fieldsName(f, e.Key), formatDuration(e.Timeout), fieldsName(f, e.Data))
}
