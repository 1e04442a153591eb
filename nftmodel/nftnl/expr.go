package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// This file translates model expressions into the register programs nft 1.0.6
// generates for the same text (checked with `nft --debug=netlink -f`), so that
// nft decodes a rule written over netlink back into exactly the text Render
// prints. Where nft has two ways to say the same thing (a 2-byte load for a /16
// versus a masked 4-byte load) we take nft's, not the shortest.

// Values the kernel keeps in host byte order: marks, ct state and status bits,
// fib results and numgen output.
var hostEndian = binary.NativeEndian

const (
	rtnLocal        = 2    // RTN_LOCAL, the fib address type of a local address
	ctStatusDNAT    = 0x20 // IPS_DST_NAT
	ifNameSize      = 16   // IFNAMSIZ
	icmpPortUnreach = 3    // ICMP_PORT_UNREACH
	icmp6PortUnr    = 4    // ICMPV6_PORT_UNREACH
)

func hostU32(v uint32) []byte {
	b := make([]byte, 4)
	hostEndian.PutUint32(b, v)
	return b
}

// reg returns the register nft names for a value starting offset 32-bit
// words into the register file: whole 16-byte registers where the offset
// allows, 32-bit registers otherwise (NFT_REG32_00 is 8).
func reg(offset uint32) uint32 {
	if offset%4 == 0 {
		return unix.NFT_REG_1 + offset/4
	}
	return unix.NFT_REG32_00 + offset
}

// addrLen is the length of an address of the family.
func addrLen(f nftmodel.Family) uint32 {
	if f == nftmodel.IPv6 {
		return 16
	}
	return 4
}

// addrOffset is where the source or destination address starts in the
// network header.
func addrOffset(f nftmodel.Family, fl nftmodel.Field) uint32 {
	switch {
	case f == nftmodel.IPv4 && fl == nftmodel.FieldSaddr:
		return 12
	case f == nftmodel.IPv4:
		return 16
	case fl == nftmodel.FieldSaddr:
		return 8
	default:
		return 24
	}
}

// loadField loads one field into the register at the given word offset and
// returns the expression and the field's length in bytes.
func loadField(f nftmodel.Family, fl nftmodel.Field, offset uint32) (expr.Any, uint32) {
	switch fl {
	case nftmodel.FieldSaddr, nftmodel.FieldDaddr:
		return &expr.Payload{DestRegister: reg(offset), Base: expr.PayloadBaseNetworkHeader,
			Offset: addrOffset(f, fl), Len: addrLen(f)}, addrLen(f)
	case nftmodel.FieldL4Proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg(offset)}, 1
	case nftmodel.FieldCtOriginalDaddr, nftmodel.FieldCtOriginalProtoDst, nftmodel.FieldCtReplySaddr, nftmodel.FieldCtReplyProtoSrc:
		return loadCtField(f, fl, offset)
	default: // FieldTHDport
		return &expr.Payload{DestRegister: reg(offset), Base: expr.PayloadBaseTransportHeader,
			Offset: 2, Len: 2}, 2
	}
}

// loadKey loads the concatenation of fields into registers starting at reg 1,
// each part padded to whole 32-bit registers as nft does.
func loadKey(f nftmodel.Family, fields []nftmodel.Field) []expr.Any {
	out := make([]expr.Any, 0, len(fields))
	var offset uint32
	for _, fl := range fields {
		e, n := loadField(f, fl, offset)
		out = append(out, e)
		offset += (n + 3) / 4
	}
	return out
}

// keyWords is how many 32-bit words loadKey fills for fields.
func keyWords(f nftmodel.Family, fields []nftmodel.Field) uint32 {
	var n uint32
	for _, fl := range fields {
		_, size := loadField(f, fl, 0)
		n += (size + 3) / 4
	}
	return n
}

func cmpReg(op expr.CmpOp, data []byte) *expr.Cmp {
	return &expr.Cmp{Op: op, Register: 1, Data: data}
}

func matchL4Proto(p uint8) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		cmpReg(expr.CmpOpEq, []byte{p}),
	}
}

// bitTest is `reg 1 & mask != 0` (set) or `== 0` on a host-endian word.
func bitTest(mask uint32, set bool) []expr.Any {
	op := expr.CmpOpEq
	if set {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(mask), Xor: hostU32(0)},
		cmpReg(op, hostU32(0)),
	}
}

func matchPrefix(f nftmodel.Family, m nftmodel.MatchPrefix) []expr.Any {
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	p := m.Prefix.Masked()
	addr := p.Addr().AsSlice()
	n := addrLen(f)
	bits := p.Bits()
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: addrOffset(f, m.Field), Len: n}
	switch {
	case bits == int(n*8):
		return []expr.Any{load, cmpReg(op, addr)}
	case bits%8 == 0 && bits > 0:
		// nft loads only the whole bytes of a byte-aligned prefix.
		load.Len = uint32(bits / 8)
		return []expr.Any{load, cmpReg(op, addr[:bits/8])}
	default:
		mask := netip.PrefixFrom(netip.IPv6Unspecified(), bits)
		if f == nftmodel.IPv4 {
			mask = netip.PrefixFrom(netip.IPv4Unspecified(), bits)
		}
		return []expr.Any{
			load,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: prefixMask(mask), Xor: make([]byte, n)},
			cmpReg(op, addr),
		}
	}
}

// matchIifname compares the input interface's name as nft does: a whole
// name with its NUL padding to IFNAMSIZ, a "prefix*" with the prefix's bytes
// only.
func matchIifname(m nftmodel.MatchIifname) ([]expr.Any, error) {
	op := expr.CmpOpEq
	if m.Negate {
		op = expr.CmpOpNeq
	}
	name, wildcard := strings.CutSuffix(m.Name, "*")
	if name == "" || len(name) >= ifNameSize || strings.ContainsAny(name, `*\"`) {
		return nil, fmt.Errorf("translate iifname match: bad interface name %q", m.Name)
	}
	data := []byte(name)
	if !wildcard {
		data = make([]byte, ifNameSize)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpReg(op, data)}, nil
}

// prefixMask returns the netmask of p as bytes.
func prefixMask(p netip.Prefix) []byte {
	b := make([]byte, p.Addr().BitLen()/8)
	for i := 0; i < p.Bits(); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}

func verdictExpr(v nftmodel.Verdict) *expr.Verdict {
	kind, chain := verdictCode(v)
	return &expr.Verdict{Kind: kind, Chain: chain}
}

// anonMap is an anonymous verdict map a rule needs; it must be added to the
// batch before the rule that looks it up.
type anonMap struct {
	set      *nftables.Set
	elements []nftables.SetElement
}

// ruleExprs translates a rule. Anonymous maps the rule uses are returned
// separately; their Set.ID is allocated when the set is added, which is why
// lookups into them are finished by the caller (see batch.addRules).
func ruleExprs(f nftmodel.Family, r nftmodel.Rule) ([]expr.Any, []anonMap, error) {
	enc := &ruleEncoder{f: f, l4proto: -1}
	for _, e := range r.Exprs {
		if err := enc.add(e); err != nil {
			return nil, nil, err
		}
	}
	return enc.out, enc.anon, nil
}

// ruleEncoder collects the register program of one rule, expression by
// expression.
type ruleEncoder struct {
	f    nftmodel.Family
	out  []expr.Any
	anon []anonMap
	// l4proto is the protocol an earlier match in the rule fixed, as nft's
	// protocol context tracks it: a TCP reset needs no match of its own then.
	l4proto int
}

// add appends the program of one expression.
func (enc *ruleEncoder) add(e nftmodel.Expr) error {
	f := enc.f
	switch e := e.(type) {
	case nftmodel.MatchPrefix:
		return enc.emitErr(checkedPrefixMatch(f, e))
	case nftmodel.MatchL4Proto:
		enc.matchL4Proto(e.Proto)
	case nftmodel.MatchMark:
		enc.emit(markTest(e))
	case nftmodel.MatchFibDaddrLocal:
		enc.emit(fibLocal(&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}))
	case nftmodel.MatchFibSaddrLocal:
		enc.emit(fibLocal(&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true}))
	case nftmodel.UpdateSet:
		enc.emit(withKey(f, e.Key, &expr.Dynset{SrcRegKey: 1, SetName: e.Set, Operation: unix.NFT_DYNSET_OP_UPDATE}))
	case nftmodel.UpdateMap:
		enc.emit(updateMapExprs(f, e))
	case nftmodel.MatchCtStateInvalid:
		enc.emit(ctBitTest(expr.CtKeySTATE, expr.CtStateBitINVALID, true))
	case nftmodel.Counter:
		enc.emit([]expr.Any{&expr.Counter{Packets: e.Packets, Bytes: e.Bytes}})
	case nftmodel.MatchCtStatusDNAT:
		enc.emit(ctBitTest(expr.CtKeySTATUS, ctStatusDNAT, !e.Negate))
	case nftmodel.MatchCtStateEstablished:
		enc.emit(ctBitTest(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, !e.Negate))
	case nftmodel.MatchIifname:
		return enc.emitErr(matchIifname(e))
	case nftmodel.MatchSet:
		enc.emit(withKey(f, e.Key, &expr.Lookup{SourceRegister: 1, SetName: e.Set, Invert: e.Negate}))
	case nftmodel.VerdictMap:
		enc.emit(withKey(f, e.Key, &expr.Lookup{SourceRegister: 1, SetName: e.Map, IsDestRegSet: true, DestRegister: 0}))
	case nftmodel.NumgenGoto:
		return enc.numgenGoto(e)
	case nftmodel.MarkOr:
		enc.emit(markSet(^e.Bits, e.Bits))
	case nftmodel.MarkXor:
		enc.emit(markSet(0xffffffff, e.Bits))
	case nftmodel.DNATMap:
		enc.emit(dnatMap(f, e))
	case nftmodel.DNAT:
		return enc.dnat(e)
	case nftmodel.Masquerade:
		enc.emit([]expr.Any{&expr.Masq{FullyRandom: e.FullyRandom}})
	case nftmodel.Reject:
		enc.reject(e)
	case nftmodel.Verdict:
		enc.emit([]expr.Any{verdictExpr(e)})
	default:
		return fmt.Errorf("translate expression: unknown type %T", e)
	}
	return nil
}

func (enc *ruleEncoder) emit(x []expr.Any) { enc.out = append(enc.out, x...) }

func (enc *ruleEncoder) emitErr(x []expr.Any, err error) error {
	if err != nil {
		return err
	}
	enc.emit(x)
	return nil
}

func (enc *ruleEncoder) matchL4Proto(p uint8) {
	enc.emit(matchL4Proto(p))
	enc.l4proto = int(p)
}

// checkedPrefixMatch is matchPrefix for a prefix of the family on an address
// field.
func checkedPrefixMatch(f nftmodel.Family, m nftmodel.MatchPrefix) ([]expr.Any, error) {
	if m.Field != nftmodel.FieldSaddr && m.Field != nftmodel.FieldDaddr {
		return nil, fmt.Errorf("translate prefix match: field %d is not an address", m.Field)
	}
	if m.Prefix.Addr().BitLen() != int(addrLen(f)*8) {
		return nil, fmt.Errorf("translate prefix match: %s is not a %s prefix", m.Prefix, f)
	}
	return matchPrefix(f, m), nil
}

// markTest is `meta mark & mask != 0` (or `== 0`).
func markTest(m nftmodel.MatchMark) []expr.Any {
	return append([]expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1}}, bitTest(m.Mask, m.IsSet)...)
}

// fibLocal is `fib … type local` for the lookup fib.
func fibLocal(fib *expr.Fib) []expr.Any {
	return []expr.Any{fib, cmpReg(expr.CmpOpEq, hostU32(rtnLocal))}
}

// ctBitTest tests bits of the connection's state or status.
func ctBitTest(key expr.CtKey, mask uint32, set bool) []expr.Any {
	return append([]expr.Any{&expr.Ct{Register: 1, Key: key}}, bitTest(mask, set)...)
}

// withKey loads a key and hands it to use: a lookup or a set update.
func withKey(f nftmodel.Family, key []nftmodel.Field, use expr.Any) []expr.Any {
	return append(loadKey(f, key), use)
}

// markSet is `meta mark set meta mark & mask ^ xor`, which nft lists as an
// or (mask the complement of xor) or a xor (mask all ones).
func markSet(mask, xor uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(mask), Xor: hostU32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
	}
}

// numgenGoto is `numgen random mod N vmap { 0 : goto …, … }` with its
// anonymous map.
func (enc *ruleEncoder) numgenGoto(e nftmodel.NumgenGoto) error {
	if len(e.Chains) == 0 {
		return fmt.Errorf("translate numgen: no chains")
	}
	// nft keys this map with host-endian integers, and says so in the
	// set's user data; google/nftables always declares an anonymous
	// set's keys big-endian, and nft would list 1 as 16777216. So the
	// numgen result is turned big-endian before the lookup and the
	// keys are big-endian: the same lookup, listed exactly as nft
	// lists its own (nft prints the conversion as its argument).
	m := anonMap{set: &nftables.Set{
		Anonymous: true,
		Constant:  true,
		IsMap:     true,
		KeyType:   nftables.TypeInteger,
		DataType:  nftables.TypeVerdict,
	}}
	for i, c := range e.Chains {
		m.elements = append(m.elements, nftables.SetElement{
			Key:         binary.BigEndian.AppendUint32(nil, uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: c},
		})
	}
	enc.anon = append(enc.anon, m)
	enc.emit([]expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(len(e.Chains)), Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		// SetName and SetID are filled in once the set is added.
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0},
	})
	return nil
}

// dnatMap is `dnat to <key> map @m`, the key ending with a random slot when
// e.Numgen > 0.
func dnatMap(f nftmodel.Family, e nftmodel.DNATMap) []expr.Any {
	out := loadKey(f, e.Key)
	if e.Numgen > 0 {
		// The random slot is the key's last part, in the register
		// after the fields, host-endian as the map's key stores it.
		out = append(out, &expr.Numgen{Register: reg(keyWords(f, e.Key)), Modulus: e.Numgen, Offset: e.Offset, Type: unix.NFT_NG_RANDOM})
	}
	return append(out,
		&expr.Lookup{SourceRegister: 1, SetName: e.Map, IsDestRegSet: true, DestRegister: 1},
		// The map's value is address . port: the port starts right
		// after the address, in whole registers. nft sets no flags here.
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto(f), RegAddrMin: 1, RegProtoMin: reg(addrLen(f) / 4)})
}

// dnat is `meta l4proto p dnat to addr:port`.
func (enc *ruleEncoder) dnat(e nftmodel.DNAT) error {
	if e.Addr.BitLen() != int(addrLen(enc.f)*8) {
		return fmt.Errorf("translate dnat: %s is not a %s address", e.Addr, enc.f)
	}
	enc.matchL4Proto(e.Proto)
	enc.emit([]expr.Any{
		&expr.Immediate{Register: 1, Data: e.Addr.AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, e.Port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto(enc.f), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	})
	return nil
}

// reject is a TCP reset, or an ICMP port unreachable of the family.
func (enc *ruleEncoder) reject(e nftmodel.Reject) {
	switch {
	case e.TCPReset:
		// nft adds the protocol match unless the rule already has
		// one, and does not list it.
		if enc.l4proto != unix.IPPROTO_TCP {
			enc.matchL4Proto(unix.IPPROTO_TCP)
		}
		enc.emit([]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	case enc.f == nftmodel.IPv6:
		enc.emit([]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmp6PortUnr}})
	default:
		enc.emit([]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmpPortUnreach}})
	}
}

func nfproto(f nftmodel.Family) uint32 {
	if f == nftmodel.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// ctDirReply is conntrack's reply direction (IP_CT_DIR_REPLY); original is 0.
const ctDirReply = 1

// loadCtField loads a conntrack address or port, as nft does for
// `ct original ip daddr`, `ct reply proto-src` and the like.
func loadCtField(f nftmodel.Family, fl nftmodel.Field, offset uint32) (expr.Any, uint32) {
	ct := &expr.Ct{Register: reg(offset)}
	n := addrLen(f)
	switch fl {
	case nftmodel.FieldCtOriginalDaddr:
		ct.Key = expr.CtKeyDSTIP
		if f == nftmodel.IPv6 {
			ct.Key = expr.CtKeyDSTIP6
		}
	case nftmodel.FieldCtReplySaddr:
		ct.Key, ct.Direction = expr.CtKeySRCIP, ctDirReply
		if f == nftmodel.IPv6 {
			ct.Key = expr.CtKeySRCIP6
		}
	case nftmodel.FieldCtOriginalProtoDst:
		ct.Key, n = expr.CtKeyPROTODST, 2
	default: // FieldCtReplyProtoSrc
		ct.Key, ct.Direction, n = expr.CtKeyPROTOSRC, ctDirReply, 2
	}
	return ct, n
}

// updateMapExprs is an UpdateMap's program: the key into the registers
// from 1, the value right after it, then the dynset.
func updateMapExprs(f nftmodel.Family, e nftmodel.UpdateMap) []expr.Any {
	out := loadKey(f, e.Key)
	data := keyWords(f, e.Key)
	for _, fl := range e.Data {
		x, n := loadField(f, fl, data)
		out = append(out, x)
		data += (n + 3) / 4
	}
	return append(out, &expr.Dynset{SrcRegKey: 1, SrcRegData: reg(keyWords(f, e.Key)), SetName: e.Map,
		Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: e.Timeout})
}
