package nftmodel

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
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
func addrLen(f Family) uint32 {
	if f == IPv6 {
		return 16
	}
	return 4
}

// addrOffset is where the source or destination address starts in the
// network header.
func addrOffset(f Family, fl Field) uint32 {
	switch {
	case f == IPv4 && fl == FieldSaddr:
		return 12
	case f == IPv4:
		return 16
	case fl == FieldSaddr:
		return 8
	default:
		return 24
	}
}

// loadField loads one field into the register at the given word offset and
// returns the expression and the field's length in bytes.
func loadField(f Family, fl Field, offset uint32) (expr.Any, uint32) {
	switch fl {
	case FieldSaddr, FieldDaddr:
		return &expr.Payload{DestRegister: reg(offset), Base: expr.PayloadBaseNetworkHeader,
			Offset: addrOffset(f, fl), Len: addrLen(f)}, addrLen(f)
	case FieldL4Proto:
		return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg(offset)}, 1
	default: // FieldTHDport
		return &expr.Payload{DestRegister: reg(offset), Base: expr.PayloadBaseTransportHeader,
			Offset: 2, Len: 2}, 2
	}
}

// loadKey loads the concatenation of fields into registers starting at reg 1,
// each part padded to whole 32-bit registers as nft does.
func loadKey(f Family, fields []Field) []expr.Any {
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
func keyWords(f Family, fields []Field) uint32 {
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

func matchPrefix(f Family, m MatchPrefix) []expr.Any {
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
		if f == IPv4 {
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
func matchIifname(m MatchIifname) ([]expr.Any, error) {
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

func verdictExpr(v Verdict) *expr.Verdict {
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
// lookups into them are finished by the caller (see batch.addRule).
func ruleExprs(f Family, r Rule) ([]expr.Any, []anonMap, error) {
	var out []expr.Any
	var anon []anonMap
	// l4proto is the protocol an earlier match in the rule fixed, as nft's
	// protocol context tracks it: a TCP reset needs no match of its own then.
	l4proto := -1
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case MatchPrefix:
			if e.Field != FieldSaddr && e.Field != FieldDaddr {
				return nil, nil, fmt.Errorf("translate prefix match: field %d is not an address", e.Field)
			}
			if e.Prefix.Addr().BitLen() != int(addrLen(f)*8) {
				return nil, nil, fmt.Errorf("translate prefix match: %s is not a %s prefix", e.Prefix, f)
			}
			out = append(out, matchPrefix(f, e)...)
		case MatchL4Proto:
			out = append(out, matchL4Proto(e.Proto)...)
			l4proto = int(e.Proto)
		case MatchMark:
			out = append(out, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1})
			out = append(out, bitTest(e.Mask, e.IsSet)...)
		case MatchFibDaddrLocal:
			out = append(out,
				&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
				cmpReg(expr.CmpOpEq, hostU32(rtnLocal)))
		case MatchFibSaddrLocal:
			out = append(out,
				&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
				cmpReg(expr.CmpOpEq, hostU32(rtnLocal)))
		case UpdateSet:
			out = append(out, loadKey(f, e.Key)...)
			out = append(out, &expr.Dynset{SrcRegKey: 1, SetName: e.Set, Operation: unix.NFT_DYNSET_OP_UPDATE})
		case MatchCtStateInvalid:
			out = append(out, &expr.Ct{Register: 1, Key: expr.CtKeySTATE})
			out = append(out, bitTest(expr.CtStateBitINVALID, true)...)
		case Counter:
			out = append(out, &expr.Counter{Packets: e.Packets, Bytes: e.Bytes})
		case MatchCtStatusDNAT:
			out = append(out, &expr.Ct{Register: 1, Key: expr.CtKeySTATUS})
			out = append(out, bitTest(ctStatusDNAT, !e.Negate)...)
		case MatchCtStateEstablished:
			out = append(out, &expr.Ct{Register: 1, Key: expr.CtKeySTATE})
			out = append(out, bitTest(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, !e.Negate)...)
		case MatchIifname:
			x, err := matchIifname(e)
			if err != nil {
				return nil, nil, err
			}
			out = append(out, x...)
		case MatchSet:
			out = append(out, loadKey(f, e.Key)...)
			out = append(out, &expr.Lookup{SourceRegister: 1, SetName: e.Set})
		case VerdictMap:
			out = append(out, loadKey(f, e.Key)...)
			out = append(out, &expr.Lookup{SourceRegister: 1, SetName: e.Map, IsDestRegSet: true, DestRegister: 0})
		case NumgenGoto:
			if len(e.Chains) == 0 {
				return nil, nil, fmt.Errorf("translate numgen: no chains")
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
			anon = append(anon, m)
			out = append(out,
				&expr.Numgen{Register: 1, Modulus: uint32(len(e.Chains)), Type: unix.NFT_NG_RANDOM},
				&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
				// SetName and SetID are filled in once the set is added.
				&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0})
		case MarkOr:
			out = append(out,
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(^e.Bits), Xor: hostU32(e.Bits)},
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true})
		case MarkXor:
			out = append(out,
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(0xffffffff), Xor: hostU32(e.Bits)},
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true})
		case DNATMap:
			out = append(out, loadKey(f, e.Key)...)
			if e.Numgen > 0 {
				// The random slot is the key's last part, in the register
				// after the fields, host-endian as the map's key stores it.
				out = append(out, &expr.Numgen{Register: reg(keyWords(f, e.Key)), Modulus: e.Numgen, Type: unix.NFT_NG_RANDOM})
			}
			out = append(out,
				&expr.Lookup{SourceRegister: 1, SetName: e.Map, IsDestRegSet: true, DestRegister: 1},
				// The map's value is address . port: the port starts right
				// after the address, in whole registers. nft sets no flags here.
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto(f), RegAddrMin: 1, RegProtoMin: reg(addrLen(f) / 4)})
		case DNAT:
			if e.Addr.BitLen() != int(addrLen(f)*8) {
				return nil, nil, fmt.Errorf("translate dnat: %s is not a %s address", e.Addr, f)
			}
			out = append(out, matchL4Proto(e.Proto)...)
			l4proto = int(e.Proto)
			out = append(out,
				&expr.Immediate{Register: 1, Data: e.Addr.AsSlice()},
				&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, e.Port)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto(f), RegAddrMin: 1, RegProtoMin: 2, Specified: true})
		case Masquerade:
			out = append(out, &expr.Masq{FullyRandom: e.FullyRandom})
		case Reject:
			switch {
			case e.TCPReset:
				// nft adds the protocol match unless the rule already has
				// one, and does not list it.
				if l4proto != unix.IPPROTO_TCP {
					out = append(out, matchL4Proto(unix.IPPROTO_TCP)...)
					l4proto = unix.IPPROTO_TCP
				}
				out = append(out, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
			case f == IPv6:
				out = append(out, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmp6PortUnr})
			default:
				out = append(out, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmpPortUnreach})
			}
		case Verdict:
			out = append(out, verdictExpr(e))
		default:
			return nil, nil, fmt.Errorf("translate expression: unknown type %T", e)
		}
	}
	return out, anon, nil
}

func nfproto(f Family) uint32 {
	if f == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}
