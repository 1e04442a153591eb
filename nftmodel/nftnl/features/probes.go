package features

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// The features nftproxy's ruleset and flow cleanup use. MinKernel is the
// release that added the feature, from the nftables wiki's list of kernel
// updates and nft's release notes; where a feature came in pieces, the last
// piece nftproxy needs. The probes themselves decide: only Linux 6.18 has
// run them here, so a MinKernel is what the refusal tells the operator to
// look for, not something a test has shown.
var (
	FilterChains = &Feature{Name: "filter base chains on prerouting, input, forward and output", MinKernel: "3.13",
		program: func(b *build) error { b.filterChains(); return nil }}
	// Before 4.18 an nftables nat chain and iptables' nat table could not
	// be used at once, which the migration from kube-proxy needs.
	NATChains = &Feature{Name: "nat base chains on prerouting, output and postrouting", MinKernel: "4.18",
		program: func(b *build) error { b.natChains(); return nil }}
	Matches = &Feature{Name: "address, th dport, meta l4proto, iifname and mark matches, meta mark set and rule comments",
		MinKernel: "5.3", program: programMatches}
	ConcatMaps = &Feature{Name: "verdict maps and sets with concatenated keys and element comments", MinKernel: "4.1",
		program: programConcatMaps}
	Numgen = &Feature{Name: "numgen random with an anonymous verdict map", MinKernel: "4.9", program: programNumgen}
	Fib    = &Feature{Name: "fib daddr type and fib saddr type", MinKernel: "4.10", program: programFib}
	Ct     = &Feature{Name: "ct state and ct status", MinKernel: "3.13", program: programCt}
	// Session affinity: `update @set { ip saddr }` on a set with timeouts.
	Timeouts = &Feature{Name: "sets with timeouts updated from the packet path", MinKernel: "4.1", program: programTimeouts}
	// The endpoints map: typeof user data, a key ending in numgen, and
	// values of address . port (20 bytes for IPv6: set data over 16 bytes
	// came with 5.6).
	DNATMap = &Feature{Name: "dnat to address . port from a typeof map keyed with numgen", MinKernel: "5.6",
		program: programDNATMap}
	Masquerade = &Feature{Name: "masquerade fully-random", MinKernel: "3.18", program: programMasquerade}
	// Rejected where nftproxy rejects: from a chain jumped to from filter
	// prerouting and output.
	Reject = &Feature{Name: "reject with tcp reset and icmp port unreachable", MinKernel: "3.18", program: programReject}
	// Drift repair reads these; nftproxy joins no conntrack group.
	Notifications = &Feature{Name: "nftables change notifications", MinKernel: "3.13", run: probeNotifications}
	// The stale-flow cleanup deletes flows by tuple.
	ConntrackNetlink = &Feature{Name: "conntrack netlink flow deletion", MinKernel: "2.6.14", run: probeConntrack}
)

// Ruleset lists the nftables features every ruleset nftproxy compiles may
// use, in an order where each probe needs only what earlier ones showed.
func Ruleset() []*Feature {
	return []*Feature{FilterChains, NATChains, Matches, ConcatMaps, Numgen, Fib, Ct, Timeouts, DNATMap, Masquerade, Reject, Notifications}
}

// Priorities of nftproxy's base chains.
const (
	prioPreDNAT   = -110
	prioDNAT      = -100
	prioPostDNAT  = -90
	prioFilter    = 0
	prioSourceNAT = 100
)

func (b *build) chain(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio int32) *nftables.Chain {
	return b.c.AddChain(&nftables.Chain{Name: name, Table: b.t, Type: typ, Hooknum: hook,
		Priority: nftables.ChainPriorityRef(nftables.ChainPriority(prio))})
}

func (b *build) regular(name string) *nftables.Chain {
	return b.c.AddChain(&nftables.Chain{Name: name, Table: b.t})
}

func (b *build) rule(c *nftables.Chain, exprs ...expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: c, Exprs: exprs})
}

// filterChains adds the filter base chains nftproxy has, and returns the
// ones rules are put in: prerouting after DNAT, and output.
func (b *build) filterChains() (pre, out *nftables.Chain) {
	b.chain("pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, prioPreDNAT)
	pre = b.chain("prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, prioPostDNAT)
	b.chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, prioFilter)
	b.chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, prioFilter)
	b.chain("output-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookOutput, prioPreDNAT)
	out = b.chain("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, prioFilter)
	return pre, out
}

// natChains adds the nat base chains and returns them.
func (b *build) natChains() (pre, out, post *nftables.Chain) {
	pre = b.chain("nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, prioDNAT)
	out = b.chain("nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, prioDNAT)
	post = b.chain("nat-postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, prioSourceNAT)
	return pre, out, post
}

func (b *build) ipv6() bool { return b.family == nftmodel.IPv6 }

func (b *build) addrLen() uint32 {
	if b.ipv6() {
		return 16
	}
	return 4
}

func (b *build) addrType() nftables.SetDatatype {
	if b.ipv6() {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// daddrOffset is where the destination address starts in the network header
// (the source address is addrLen before it).
func (b *build) daddrOffset() uint32 {
	if b.ipv6() {
		return 24
	}
	return 16
}

// addr returns a documentation address of the family.
func (b *build) addr() []byte {
	if b.ipv6() {
		return netip.MustParseAddr("2001:db8::1").AsSlice()
	}
	return netip.MustParseAddr("192.0.2.1").AsSlice()
}

// reg is the register nft names for a value starting offset 32-bit words
// into the register file: 16-byte registers where aligned, else 32-bit ones.
func reg(offset uint32) uint32 {
	if offset%4 == 0 {
		return unix.NFT_REG_1 + offset/4
	}
	return unix.NFT_REG32_00 + offset
}

func hostU32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// serviceKey loads daddr . l4proto . th dport from register 1 on, as a
// concatenation (each part in whole 32-bit words), and returns the number
// of words it fills.
func (b *build) serviceKey() ([]expr.Any, uint32) {
	words := b.addrLen() / 4
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: b.daddrOffset(), Len: b.addrLen()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg(words)},
		&expr.Payload{DestRegister: reg(words + 1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, words + 2
}

// serviceKeyBytes is the concatenated key daddr . tcp . 80.
func (b *build) serviceKeyBytes() []byte {
	k := append(b.addr(), pad4([]byte{unix.IPPROTO_TCP})...)
	return append(k, pad4(binary.BigEndian.AppendUint16(nil, 80))...)
}

func programMatches(b *build) error {
	pre, _ := b.filterChains()
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: pre, UserData: ruleComment("default/probe:http"), Exprs: []expr.Any{
		// ip daddr 192.0.2.0/24
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: b.daddrOffset(), Len: 3},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b.addr()[:3]},
		// meta l4proto tcp th dport 80
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, 80)},
		// iifname "veth*"
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte("veth")},
		// meta mark & 0x4000 == 0
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(0x4000), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostU32(0)},
		// meta mark set meta mark | 0x4000
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(^uint32(0x4000)), Xor: hostU32(0x4000)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
	}})
	return nil
}

// ruleComment is a rule's user data holding a comment, as nft writes it.
func ruleComment(s string) []byte {
	return append([]byte{0, byte(len(s) + 1)}, append([]byte(s), 0)...)
}

func programConcatMaps(b *build) error {
	pre, _, post := b.natChains()
	target := b.regular("target")
	b.rule(target, &expr.Verdict{Kind: expr.VerdictAccept})
	key, err := nftables.ConcatSetType(b.addrType(), nftables.TypeInetProto, nftables.TypeInetService)
	if err != nil {
		return err
	}
	vmap := &nftables.Set{Table: b.t, Name: "service-ips", KeyType: key, DataType: nftables.TypeVerdict, IsMap: true}
	if err := b.c.AddSet(vmap, []nftables.SetElement{{Key: b.serviceKeyBytes(), Comment: "default/probe:http",
		VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: target.Name}}}); err != nil {
		return err
	}
	load, _ := b.serviceKey()
	b.rule(pre, append(load, &expr.Lookup{SourceRegister: 1, SetName: vmap.Name, IsDestRegSet: true, DestRegister: 0})...)

	pairs, err := nftables.ConcatSetType(b.addrType(), b.addrType())
	if err != nil {
		return err
	}
	hairpin := &nftables.Set{Table: b.t, Name: "hairpin", KeyType: pairs}
	if err := b.c.AddSet(hairpin, []nftables.SetElement{{Key: append(b.addr(), b.addr()...)}}); err != nil {
		return err
	}
	words := b.addrLen() / 4
	b.rule(post,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: b.daddrOffset() - b.addrLen(), Len: b.addrLen()},
		&expr.Payload{DestRegister: reg(words), Base: expr.PayloadBaseNetworkHeader, Offset: b.daddrOffset(), Len: b.addrLen()},
		&expr.Lookup{SourceRegister: 1, SetName: hairpin.Name},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: target.Name})
	return nil
}

func programNumgen(b *build) error {
	pre, _, _ := b.natChains()
	ep0, ep1 := b.regular("endpoint-0"), b.regular("endpoint-1")
	// As nftproxy writes it: keys big-endian, the random number converted.
	m := &nftables.Set{Table: b.t, Anonymous: true, Constant: true, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	var els []nftables.SetElement
	for i, c := range []*nftables.Chain{ep0, ep1} {
		els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: c.Name}})
	}
	if err := b.c.AddSet(m, els); err != nil {
		return err
	}
	b.rule(pre,
		&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: 0})
	return nil
}

func programFib(b *build) error {
	pre, out := b.filterChains()
	const rtnLocal = 2
	b.rule(pre,
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostU32(rtnLocal)})
	b.rule(out,
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostU32(rtnLocal)})
	return nil
}

func programCt(b *build) error {
	b.filterChains()
	_, _, post := b.natChains()
	fwd := &nftables.Chain{Name: "forward", Table: b.t}
	const ctStatusDNAT = 0x20
	b.rule(fwd,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(expr.CtStateBitINVALID), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: hostU32(0)},
		&expr.Verdict{Kind: expr.VerdictDrop})
	b.rule(post,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hostU32(ctStatusDNAT), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: hostU32(0)},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: hostU32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: hostU32(0)})
	return nil
}

func programTimeouts(b *build) error {
	pre, _, _ := b.natChains()
	affinity := &nftables.Set{Table: b.t, Name: "affinity", KeyType: b.addrType(), KeyByteOrder: binaryutil.BigEndian,
		HasTimeout: true, Timeout: 3 * time.Hour, Dynamic: true, Size: 65535}
	if err := b.c.AddSet(affinity, nil); err != nil {
		return err
	}
	saddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: b.daddrOffset() - b.addrLen(), Len: b.addrLen()}
	b.rule(pre, saddr, &expr.Dynset{SrcRegKey: 1, SetName: affinity.Name, Operation: unix.NFT_DYNSET_OP_UPDATE})
	b.rule(pre, saddr, &expr.Lookup{SourceRegister: 1, SetName: affinity.Name}, &expr.Verdict{Kind: expr.VerdictAccept})
	return nil
}

func programDNATMap(b *build) error {
	pre, _, _ := b.natChains()
	key, err := nftables.ConcatSetType(b.addrType(), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
	if err != nil {
		return err
	}
	data, err := nftables.ConcatSetType(b.addrType(), nftables.TypeInetService)
	if err != nil {
		return err
	}
	m := &nftables.Set{Table: b.t, Name: "endpoints", KeyType: key, DataType: data, IsMap: true}
	port := pad4(binary.BigEndian.AppendUint16(nil, 8080))
	// Declared as nftproxy declares it, so that the kernel is asked to keep
	// as many bytes of user data as nftproxy's map carries:
	//	typeof ip daddr . meta l4proto . th dport . numgen random mod 65536 : ip daddr . th dport
	addr := nftmodel.TypeIPv4Addr
	if b.ipv6() {
		addr = nftmodel.TypeIPv6Addr
	}
	decl := &nftmodel.Set{Name: m.Name,
		Key:  []nftmodel.DataType{addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeInteger},
		Data: []nftmodel.DataType{addr, nftmodel.TypeInetService},
		Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport},
			KeyNumgen: 65536, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}}
	if err := b.raw.AddTypeofSet(b.family, m, []nftables.SetElement{
		{Key: append(b.serviceKeyBytes(), hostU32(0)...), Val: append(b.addr(), port...)},
		{Key: append(b.serviceKeyBytes(), hostU32(1)...), Val: append(b.addr(), port...)},
	}, decl); err != nil {
		return err
	}
	load, words := b.serviceKey()
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(b.t.Family), RegAddrMin: 1, RegProtoMin: reg(b.addrLen() / 4)}
	b.rule(pre, append(load,
		&expr.Numgen{Register: reg(words), Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, SetName: m.Name, IsDestRegSet: true, DestRegister: 1},
		nat)...)
	return nil
}

func programMasquerade(b *build) error {
	_, _, post := b.natChains()
	b.rule(post, &expr.Masq{FullyRandom: true})
	return nil
}

func programReject(b *build) error {
	pre, out := b.filterChains()
	reject := b.regular("reject-chain")
	b.rule(pre, &expr.Verdict{Kind: expr.VerdictJump, Chain: reject.Name})
	b.rule(out, &expr.Verdict{Kind: expr.VerdictJump, Chain: reject.Name})
	b.rule(reject,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	code := uint8(3) // ICMP_PORT_UNREACH
	if b.ipv6() {
		code = 4 // ICMPV6_PORT_UNREACH
	}
	b.rule(reject, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
	return nil
}
