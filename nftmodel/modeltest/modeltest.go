// Package modeltest holds test data for the model's users: examples of
// every expression type, so that each switch over nftmodel.Expr (the
// renderer, the tracer, the netlink encoder, the reader) can be tested
// against all of them. TestExamplesCoverEveryExpr in nftmodel fails when a
// type of the model has no example here.
package modeltest

import (
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// The names of the sets and chains the examples use; Ruleset declares them.
const (
	SetName      = "addrs"            // MatchSet
	RangesName   = "ranges"           // MatchSet, negated, in an interval set
	VmapName     = "services"         // VerdictMap
	AffinityName = "affinity"         // UpdateSet
	DNATName     = "endpoints"        // DNATMap without a random slot
	SlotsName    = "slots"            // DNATMap with one
	ClientsName  = "clients"          // UpdateMap
	TargetChain  = "target"           // Verdict jump and goto
	PickA, PickB = "pick-a", "pick-b" // NumgenGoto
)

var svcKey = []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport}

// Exprs returns examples of every expression type in the family's
// addresses: at least one per type, and one per way an encoder may take
// (a DNAT map with and without a random slot, each kind of verdict, …).
func Exprs(f nftmodel.Family) []nftmodel.Expr {
	addr, pfx, short := netip.MustParseAddr("10.96.0.10"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.240.0.0/12")
	if f == nftmodel.IPv6 {
		addr, pfx, short = netip.MustParseAddr("fd00::10"), netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("fd00::/63")
	}
	return []nftmodel.Expr{
		nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx},
		nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: short, Negate: true},
		nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: netip.PrefixFrom(addr, addr.BitLen())},
		nftmodel.MatchL4Proto{Proto: 17},
		nftmodel.MatchMark{Mask: 0x4000, IsSet: true},
		nftmodel.MatchMark{Mask: 0x4000},
		nftmodel.MatchFibDaddrLocal{},
		nftmodel.MatchFibSaddrLocal{},
		nftmodel.MatchCtStateInvalid{},
		nftmodel.Counter{},
		nftmodel.MatchCtStatusDNAT{},
		nftmodel.MatchCtStatusDNAT{Negate: true},
		nftmodel.MatchCtStateEstablished{},
		nftmodel.MatchCtStateEstablished{Negate: true},
		nftmodel.MatchIifname{Name: "eth0"},
		nftmodel.MatchIifname{Name: "veth*", Negate: true},
		nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: SetName},
		nftmodel.MatchSet{Key: append(svcKey[:3:3], nftmodel.FieldSaddr), Set: RangesName, Negate: true},
		nftmodel.VerdictMap{Key: svcKey, Map: VmapName},
		nftmodel.NumgenGoto{Chains: []string{PickA, PickB}},
		nftmodel.UpdateSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: AffinityName},
		nftmodel.UpdateMap{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldCtOriginalDaddr, nftmodel.FieldL4Proto, nftmodel.FieldCtOriginalProtoDst},
			Data: []nftmodel.Field{nftmodel.FieldCtReplySaddr, nftmodel.FieldCtReplyProtoSrc}, Map: ClientsName, Timeout: time.Hour},
		nftmodel.MarkOr{Bits: 0x4000},
		nftmodel.MarkXor{Bits: 0x4000},
		nftmodel.DNATMap{Key: svcKey, Map: DNATName},
		nftmodel.DNATMap{Key: svcKey, Numgen: 3, Map: SlotsName},
		nftmodel.DNATMap{Key: svcKey, Numgen: 2, Offset: 65536, Map: SlotsName},
		nftmodel.DNAT{Proto: 6, Addr: addr, Port: 8080},
		nftmodel.Masquerade{},
		nftmodel.Masquerade{FullyRandom: true},
		nftmodel.Reject{},
		nftmodel.Reject{TCPReset: true},
		nftmodel.Verdict{Kind: nftmodel.Accept},
		nftmodel.Verdict{Kind: nftmodel.Drop},
		nftmodel.Verdict{Kind: nftmodel.Return},
		nftmodel.Verdict{Kind: nftmodel.Jump, Chain: TargetChain},
		nftmodel.Verdict{Kind: nftmodel.Goto, Chain: TargetChain},
	}
}

// Ruleset returns a table of the family whose NAT prerouting chain holds one
// rule of each of exprs, with the sets and chains Exprs' examples name
// (empty). It is for the model's tests; the kernel refuses some of the
// examples in a prerouting chain (reject, masquerade).
func Ruleset(f nftmodel.Family, exprs ...nftmodel.Expr) *nftmodel.Ruleset {
	addr := nftmodel.TypeIPv4Addr
	if f == nftmodel.IPv6 {
		addr = nftmodel.TypeIPv6Addr
	}
	svc := []nftmodel.DataType{addr, nftmodel.TypeInetProto, nftmodel.TypeInetService}
	pre := &nftmodel.Chain{Name: "pre", Base: &nftmodel.BaseChain{Type: nftmodel.TypeNAT, Hook: nftmodel.HookPrerouting, Priority: -100}}
	for _, e := range exprs {
		pre.Rules = append(pre.Rules, nftmodel.Rule{Exprs: []nftmodel.Expr{e}})
	}
	return &nftmodel.Ruleset{
		Family: f,
		Table:  "modeltest",
		Sets: []*nftmodel.Set{
			{Name: SetName, Key: []nftmodel.DataType{addr}},
			{Name: RangesName, Key: append(svc[:3:3], addr), Interval: true},
			{Name: VmapName, Key: svc, Data: []nftmodel.DataType{nftmodel.TypeVerdict}},
			{Name: AffinityName, Key: []nftmodel.DataType{addr}, Timeout: 3 * time.Hour},
			{Name: DNATName, Key: svc, Data: []nftmodel.DataType{addr, nftmodel.TypeInetService}},
			{Name: SlotsName, Key: append(svc, nftmodel.TypeInteger), Data: []nftmodel.DataType{addr, nftmodel.TypeInetService},
				Typeof: &nftmodel.Typeof{Key: svcKey, KeyNumgen: 3, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}},
			{Name: ClientsName, Key: []nftmodel.DataType{addr, addr, nftmodel.TypeInetProto, nftmodel.TypeInetService},
				Data: []nftmodel.DataType{addr, nftmodel.TypeInetService}, Timeout: time.Hour,
				Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport},
					Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}},
		},
		Chains: []*nftmodel.Chain{pre, {Name: TargetChain}, {Name: PickA}, {Name: PickB}},
	}
}
