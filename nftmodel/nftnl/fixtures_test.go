package nftnl

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// Fixtures for the applier's tests: rulesets that between them use every
// expression, data type, verdict and base chain kind of the model, in both
// families.

var (
	vipType  = []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService}
	vip6Type = []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService}
	svcKey   = []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport}
	slotType = []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeInteger}
	// The shared affinity map's key and value, and the rules that fill it.
	clientKey   = []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport}
	connKey     = []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldCtOriginalDaddr, nftmodel.FieldL4Proto, nftmodel.FieldCtOriginalProtoDst}
	connTarget  = []nftmodel.Field{nftmodel.FieldCtReplySaddr, nftmodel.FieldCtReplyProtoSrc}
	targetField = []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}
	fwField     = []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport, nftmodel.FieldSaddr}
)

// clientAffinity is a shared affinity map of the family's addresses.
func clientAffinity(addr nftmodel.DataType) *nftmodel.Set {
	return &nftmodel.Set{Name: "client-affinity", Key: []nftmodel.DataType{addr, addr, nftmodel.TypeInetProto, nftmodel.TypeInetService},
		Data: []nftmodel.DataType{addr, nftmodel.TypeInetService}, Timeout: 3 * time.Hour, Size: 1 << 20,
		Typeof: &nftmodel.Typeof{Key: clientKey, Data: targetField}}
}

// affinityChain remembers connections in client-affinity and looks them up.
func affinityChain() *nftmodel.Chain {
	return &nftmodel.Chain{Name: "affinity-update", Rules: []nftmodel.Rule{
		nlRule(nftmodel.MatchL4Proto{Proto: 6}, nftmodel.UpdateMap{Key: connKey, Data: connTarget, Map: "client-affinity", Timeout: 3 * time.Hour}),
		nlRule(nftmodel.MatchL4Proto{Proto: 132}, nftmodel.UpdateMap{Key: connKey, Data: connTarget, Map: "client-affinity", Timeout: 90 * time.Second}),
		nlRule(nftmodel.MatchL4Proto{Proto: 17}, nftmodel.VerdictMap{Key: []nftmodel.Field{nftmodel.FieldCtOriginalDaddr, nftmodel.FieldL4Proto, nftmodel.FieldCtOriginalProtoDst}, Map: "service-ips"}),
		nlRule(nftmodel.DNATMap{Key: clientKey, Map: "client-affinity"}),
	}}
}

// fwType is the key of the shared firewall's allowed ranges: a load
// balancer address, protocol and port, and the client's address.
var fwType = []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeIPv4Addr}

func fwKey(lb netip.Addr, client string) []nftmodel.Value {
	return []nftmodel.Value{nftmodel.A(lb), nftmodel.N(6), nftmodel.N(80), nftmodel.A(ip(client))}
}

func slotKey(a string, p, port, slot uint32) []nftmodel.Value {
	return []nftmodel.Value{nftmodel.A(ip(a)), nftmodel.N(p), nftmodel.N(port), nftmodel.N(slot)}
}

func ip(s string) netip.Addr                  { return netip.MustParseAddr(s) }
func pfx(s string) netip.Prefix               { return netip.MustParsePrefix(s) }
func nlGoto(c string) *nftmodel.Verdict       { return &nftmodel.Verdict{Kind: nftmodel.Goto, Chain: c} }
func nlJump(c string) nftmodel.Verdict        { return nftmodel.Verdict{Kind: nftmodel.Jump, Chain: c} }
func nlRule(e ...nftmodel.Expr) nftmodel.Rule { return nftmodel.Rule{Exprs: e} }
func nlKey(a string, p, port uint32) []nftmodel.Value {
	return []nftmodel.Value{nftmodel.A(ip(a)), nftmodel.N(p), nftmodel.N(port)}
}

func nlBase(name string, t nftmodel.ChainType, h nftmodel.Hook, prio int32, rules ...nftmodel.Rule) *nftmodel.Chain {
	return &nftmodel.Chain{Name: name, Base: &nftmodel.BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules}
}

// fullRuleset is an IPv4 table using every expression and every kind of set.
func fullRuleset() *nftmodel.Ruleset {
	return &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "nftproxy-test",
		Sets: []*nftmodel.Set{
			{Name: "service-ips", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{
				{Key: nlKey("10.96.0.10", 6, 80), Comment: "default/web:http", Verdict: nlGoto("svc-web")},
				{Key: nlKey("10.96.0.10", 17, 53), Comment: "kube-system/dns:dns", Verdict: nlGoto("svc-dns")},
				{Key: nlKey("10.96.0.11", 132, 9000), Verdict: &nftmodel.Verdict{Kind: nftmodel.Jump, Chain: "reject-chain"}},
				{Key: nlKey("10.96.0.12", 6, 443), Verdict: &nftmodel.Verdict{Kind: nftmodel.Drop}},
				{Key: nlKey("10.96.0.13", 6, 443), Verdict: &nftmodel.Verdict{Kind: nftmodel.Accept}},
				{Key: nlKey("10.96.0.14", 6, 443), Verdict: &nftmodel.Verdict{Kind: nftmodel.Return}},
			}},
			{Name: "service-nodeports", Key: []nftmodel.DataType{nftmodel.TypeInetProto, nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.N(6), nftmodel.N(30080)}, Comment: "default/web:http", Verdict: nlGoto("svc-web")},
			}},
			{Name: "endpoints", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}, Elements: []nftmodel.Element{
				{Key: nlKey("10.96.0.10", 6, 80), Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.2")), nftmodel.N(8080)}, Comment: "default/web:http"},
				{Key: nlKey("10.96.0.10", 17, 53), Data: []nftmodel.Value{nftmodel.A(ip("10.244.2.3")), nftmodel.N(53)}},
			}},
			{Name: "hairpin", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeIPv4Addr}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.A(ip("10.244.1.2")), nftmodel.A(ip("10.244.1.2"))}, Comment: "default/web"},
				{Key: []nftmodel.Value{nftmodel.A(ip("10.244.2.3")), nftmodel.A(ip("10.244.2.3"))}},
			}},
			{Name: "nodeport-ips", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.A(ip("192.168.1.10"))}},
				{Key: []nftmodel.Value{nftmodel.A(ip("10.0.0.5"))}, Comment: "node"},
				{Key: []nftmodel.Value{nftmodel.A(ip("10.0.0.6"))}},
				{Key: []nftmodel.Value{nftmodel.A(ip("10.0.0.7"))}},
			}},
			{Name: "ports", Key: []nftmodel.DataType{nftmodel.TypeInetService}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.N(1)}}, {Key: []nftmodel.Value{nftmodel.N(2)}}, {Key: []nftmodel.Value{nftmodel.N(3)}}, {Key: []nftmodel.Value{nftmodel.N(4)}},
				{Key: []nftmodel.Value{nftmodel.N(5)}, Comment: "five"}, {Key: []nftmodel.Value{nftmodel.N(6)}}, {Key: []nftmodel.Value{nftmodel.N(7)}},
			}},
			{Name: "port-verdicts", Key: []nftmodel.DataType{nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.N(22)}, Verdict: &nftmodel.Verdict{Kind: nftmodel.Accept}},
			}},
			{Name: "protos", Key: []nftmodel.DataType{nftmodel.TypeInetProto}, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.N(6)}}, {Key: []nftmodel.Value{nftmodel.N(17)}}, {Key: []nftmodel.Value{nftmodel.N(132)}}}},
			{Name: "affinity", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr}, Timeout: 3 * time.Hour},
			{Name: "affinity-ports", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}, Timeout: 10800 * time.Second},
			{Name: "empty-map", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}},
			{Name: "slots", Key: slotType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService},
				Typeof: &nftmodel.Typeof{Key: svcKey, KeyNumgen: 65536, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}, Elements: []nftmodel.Element{
					{Key: slotKey("10.96.0.10", 6, 80, 0), Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.2")), nftmodel.N(8080)}, Comment: "default/web:http"},
					{Key: slotKey("10.96.0.10", 6, 80, 1), Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.3")), nftmodel.N(8080)}},
					{Key: slotKey("10.96.0.10", 6, 80, 256), Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.4")), nftmodel.N(8080)}},
					{Key: slotKey("10.96.0.10", 6, 80, 300), Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.5")), nftmodel.N(8080)}},
					{Key: slotKey("10.96.0.9", 17, 53, 2), Data: []nftmodel.Value{nftmodel.A(ip("10.244.2.3")), nftmodel.N(53)}},
				}},
			{Name: "node-port-slots", Key: []nftmodel.DataType{nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeInteger}, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService},
				Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldL4Proto, nftmodel.FieldTHDport}, KeyNumgen: 1, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}, Elements: []nftmodel.Element{
					{Key: []nftmodel.Value{nftmodel.N(6), nftmodel.N(30080), nftmodel.N(0)}, Data: []nftmodel.Value{nftmodel.A(ip("10.244.1.2")), nftmodel.N(8080)}},
				}},
			{Name: "pairs", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeIPv4Addr}, Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr}}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.A(ip("10.244.1.2")), nftmodel.A(ip("10.244.1.2"))}},
			}},
			clientAffinity(nftmodel.TypeIPv4Addr),
			{Name: "firewall-ips", Key: vipType, Elements: []nftmodel.Element{{Key: nlKey("10.96.0.1", 6, 80)}}},
			// Out of nft's order: the applier sends an interval set's
			// elements sorted, as nft lists them in the order they came.
			{Name: "firewall-allow", Key: fwType, Interval: true, Elements: []nftmodel.Element{
				{Key: fwKey(ip("10.96.0.1"), "192.168.0.0"), KeyEnd: fwKey(ip("10.96.0.1"), "192.168.255.255"), Comment: "default/web:http"},
				{Key: fwKey(ip("10.96.0.1"), "10.96.0.1")},
				{Key: fwKey(ip("10.96.0.1"), "0.0.0.0"), KeyEnd: fwKey(ip("10.96.0.1"), "0.255.255.255")},
				{Key: fwKey(ip("10.96.0.1"), "1.2.3.4"), KeyEnd: fwKey(ip("10.96.0.1"), "1.2.3.9")},
			}},
		},
		Chains: []*nftmodel.Chain{
			nlBase("nat-prerouting", nftmodel.TypeNAT, nftmodel.HookPrerouting, -100, nlRule(nlJump("services"))),
			nlBase("nat-output", nftmodel.TypeNAT, nftmodel.HookOutput, -100, nlRule(nlJump("services"))),
			nlBase("nat-postrouting", nftmodel.TypeNAT, nftmodel.HookPostrouting, 100, nlRule(nlJump("masquerading"))),
			nlBase("filter-prerouting-pre-dnat", nftmodel.TypeFilter, nftmodel.HookPrerouting, -110,
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.240.0.0/12")}, nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("10.96.0.10/32")}, nftmodel.Verdict{Kind: nftmodel.Drop}),
				nlRule(nftmodel.MatchSet{Key: svcKey, Set: "firewall-ips"}, nftmodel.MatchSet{Key: fwField, Set: "firewall-allow", Negate: true}, nftmodel.Verdict{Kind: nftmodel.Drop})),
			nlBase("filter-output-pre-dnat", nftmodel.TypeFilter, nftmodel.HookOutput, -110,
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("0.0.0.0/0")}, nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.0.0.0/8"), Negate: true}, nftmodel.Verdict{Kind: nftmodel.Accept})),
			nlBase("filter-input", nftmodel.TypeFilter, nftmodel.HookInput, 0,
				nlRule(nftmodel.MatchCtStateInvalid{}, nftmodel.Verdict{Kind: nftmodel.Drop}),
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("127.0.0.0/8")}, nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("127.0.0.0/8"), Negate: true},
					nftmodel.MatchCtStateEstablished{Negate: true}, nftmodel.MatchCtStatusDNAT{Negate: true}, nftmodel.Verdict{Kind: nftmodel.Drop}),
				nlRule(nftmodel.MatchCtStateEstablished{}, nftmodel.MatchCtStatusDNAT{}, nftmodel.Verdict{Kind: nftmodel.Accept}),
				nlRule(nftmodel.MatchIifname{Name: "br0"}, nftmodel.Verdict{Kind: nftmodel.Return}),
				nlRule(nftmodel.MatchIifname{Name: "veth*", Negate: true}, nftmodel.Verdict{Kind: nftmodel.Return}),
				nlRule(nftmodel.MatchIifname{Name: "cali*"}, nftmodel.Verdict{Kind: nftmodel.Accept}),
				nlRule(nftmodel.MatchIifname{Name: "eth0", Negate: true}, nftmodel.Verdict{Kind: nftmodel.Accept})),
			nlBase("filter-forward", nftmodel.TypeFilter, nftmodel.HookForward, 0,
				nlRule(nftmodel.MatchCtStateInvalid{}, nftmodel.Counter{}, nftmodel.Verdict{Kind: nftmodel.Drop}),
				nlRule(nftmodel.MatchMark{Mask: 0x8000, IsSet: true}, nftmodel.Verdict{Kind: nftmodel.Drop})),
			nlBase("filter-output", nftmodel.TypeFilter, nftmodel.HookOutput, 0, nlRule(nlJump("reject-chain"))),
			{Name: "services", Rules: []nftmodel.Rule{
				nlRule(nftmodel.VerdictMap{Key: svcKey, Map: "service-ips"}),
				nlRule(nftmodel.MatchFibDaddrLocal{}, nftmodel.VerdictMap{Key: []nftmodel.Field{nftmodel.FieldL4Proto, nftmodel.FieldTHDport}, Map: "service-nodeports"}),
				nlRule(nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldDaddr}, Set: "nodeport-ips"}, nftmodel.VerdictMap{Key: []nftmodel.Field{nftmodel.FieldL4Proto, nftmodel.FieldTHDport}, Map: "service-nodeports"}),
				nlRule(nftmodel.VerdictMap{Key: []nftmodel.Field{nftmodel.FieldTHDport}, Map: "port-verdicts"}),
				{Exprs: []nftmodel.Expr{nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldL4Proto}, Set: "protos"}, nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: "affinity"}, nftmodel.Verdict{Kind: nftmodel.Accept}}, Comment: "sets"},
				nlRule(nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldTHDport}, Set: "affinity-ports"}, nftmodel.Verdict{Kind: nftmodel.Return}),
			}},
			{Name: "mark-for-masquerade", Rules: []nftmodel.Rule{nlRule(nftmodel.MarkOr{Bits: 0x4000})}},
			{Name: "masquerading", Rules: []nftmodel.Rule{
				nlRule(nftmodel.MatchMark{Mask: 0x4000}, nftmodel.Verdict{Kind: nftmodel.Return}),
				nlRule(nftmodel.MarkXor{Bits: 0x4000}),
				{Exprs: []nftmodel.Expr{nftmodel.Masquerade{FullyRandom: true}}, Comment: "masquerade"},
				nlRule(nftmodel.MatchCtStatusDNAT{}, nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr}, Set: "hairpin"}, nftmodel.Masquerade{}),
			}},
			{Name: "svc-web", Rules: []nftmodel.Rule{
				{Exprs: []nftmodel.Expr{nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.244.0.0/16"), Negate: true}, nlJump("mark-for-masquerade")}, Comment: "default/web:http cluster IP"},
				{Exprs: []nftmodel.Expr{nftmodel.NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2", "ep-web-3"}}}, Comment: "default/web:http"},
			}},
			{Name: "svc-dns", Rules: []nftmodel.Rule{
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.244.0.0/20"), Negate: true}, nlJump("mark-for-masquerade")),
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.2.0.0/15")}, nftmodel.Verdict{Kind: nftmodel.Goto, Chain: "ep-dns"}),
				nlRule(nftmodel.NumgenGoto{Chains: []string{"ep-dns"}}),
				nlRule(nftmodel.NumgenGoto{Chains: []string{"ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns"}}),
			}},
			{Name: "ep-web-1", Rules: []nftmodel.Rule{
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.244.1.2/32")}, nlJump("mark-for-masquerade")),
				{Exprs: []nftmodel.Expr{nftmodel.DNAT{Proto: 6, Addr: ip("10.244.1.2"), Port: 8080}}, Comment: "default/web:http"},
			}},
			{Name: "ep-web-2", Rules: []nftmodel.Rule{
				nlRule(nftmodel.UpdateSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: "affinity"}),
				nlRule(nftmodel.MatchFibSaddrLocal{}, nlJump("mark-for-masquerade")),
				nlRule(nftmodel.DNAT{Proto: 6, Addr: ip("10.244.1.3"), Port: 8080}),
			}},
			{Name: "ep-web-3", Rules: []nftmodel.Rule{nlRule(nftmodel.DNAT{Proto: 132, Addr: ip("10.244.1.4"), Port: 1})}},
			{Name: "ep-dns", Rules: []nftmodel.Rule{
				nlRule(nftmodel.DNATMap{Key: svcKey, Map: "endpoints"}),
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.244.0.0/16")}, nftmodel.DNATMap{Key: svcKey, Numgen: 3, Map: "slots"}),
				nlRule(nftmodel.DNATMap{Key: svcKey, Numgen: 1, Map: "slots"}),
				nlRule(nftmodel.DNATMap{Key: svcKey, Numgen: 2, Offset: 65536, Map: "slots"}),
				nlRule(nftmodel.DNATMap{Key: []nftmodel.Field{nftmodel.FieldL4Proto, nftmodel.FieldTHDport}, Numgen: 5000, Map: "node-port-slots"}),
				nlRule(nftmodel.DNAT{Proto: 17, Addr: ip("10.244.2.3"), Port: 53}),
			}},
			{Name: "reject-chain", Rules: []nftmodel.Rule{
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("10.96.0.11/32")}, nftmodel.Reject{TCPReset: true}),
				nlRule(nftmodel.MatchL4Proto{Proto: 17}, nftmodel.Reject{}),
				nlRule(nftmodel.Reject{}),
			}},
			affinityChain(),
			{Name: "empty"},
		},
	}
}

// full6Ruleset is the IPv6 counterpart, smaller but with every
// family-specific encoding: addresses, prefixes, DNAT, the DNAT map, reject.
func full6Ruleset() *nftmodel.Ruleset {
	key := func(a string, p, port uint32) []nftmodel.Value {
		return []nftmodel.Value{nftmodel.A(ip(a)), nftmodel.N(p), nftmodel.N(port)}
	}
	return &nftmodel.Ruleset{Family: nftmodel.IPv6, Table: "nftproxy-test6",
		Sets: []*nftmodel.Set{
			{Name: "service-ips", Key: vip6Type, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{
				{Key: key("fd00:96::10", 6, 80), Comment: "default/web:http", Verdict: nlGoto("svc-web")},
				{Key: key("fd00:96::11", 17, 53), Verdict: &nftmodel.Verdict{Kind: nftmodel.Drop}},
			}},
			{Name: "endpoints", Key: vip6Type, Data: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetService}, Elements: []nftmodel.Element{
				{Key: key("fd00:96::10", 6, 80), Data: []nftmodel.Value{nftmodel.A(ip("fd00:244::2")), nftmodel.N(8080)}, Comment: "default/web:http"},
			}},
			{Name: "hairpin", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeIPv6Addr}, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.A(ip("fd00:244::2")), nftmodel.A(ip("fd00:244::2"))}},
			}},
			{Name: "nodeport-ips", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr}, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(ip("2001:db8::1"))}}}},
			{Name: "affinity", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr}, Timeout: 90 * time.Minute},
			{Name: "slots", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeInteger}, Data: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetService},
				Typeof: &nftmodel.Typeof{Key: svcKey, KeyNumgen: 65536, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}, Elements: []nftmodel.Element{
					{Key: []nftmodel.Value{nftmodel.A(ip("fd00:96::10")), nftmodel.N(6), nftmodel.N(80), nftmodel.N(0)}, Data: []nftmodel.Value{nftmodel.A(ip("fd00:244::2")), nftmodel.N(8080)}},
					{Key: []nftmodel.Value{nftmodel.A(ip("fd00:96::10")), nftmodel.N(6), nftmodel.N(80), nftmodel.N(1)}, Data: []nftmodel.Value{nftmodel.A(ip("fd00:244::3")), nftmodel.N(8080)}, Comment: "default/web:http"},
				}},
			{Name: "pairs", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeIPv6Addr}, Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr}}},
			clientAffinity(nftmodel.TypeIPv6Addr),
			{Name: "firewall-allow", Key: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeIPv6Addr}, Interval: true, Elements: []nftmodel.Element{
				{Key: []nftmodel.Value{nftmodel.A(ip("fd00:96::10")), nftmodel.N(6), nftmodel.N(80), nftmodel.A(ip("fd00:1::"))},
					KeyEnd: []nftmodel.Value{nftmodel.A(ip("fd00:96::10")), nftmodel.N(6), nftmodel.N(80), nftmodel.A(ip("fd00:1::ffff:ffff:ffff:ffff"))}, Comment: "default/web:http"},
				{Key: []nftmodel.Value{nftmodel.A(ip("fd00:96::10")), nftmodel.N(6), nftmodel.N(80), nftmodel.A(ip("fd00:96::10"))}},
			}},
		},
		Chains: []*nftmodel.Chain{
			nlBase("nat-prerouting", nftmodel.TypeNAT, nftmodel.HookPrerouting, -100, nlRule(nftmodel.VerdictMap{Key: svcKey, Map: "service-ips"})),
			nlBase("nat-output", nftmodel.TypeNAT, nftmodel.HookOutput, -100, nlRule(nftmodel.VerdictMap{Key: svcKey, Map: "service-ips"})),
			nlBase("nat-postrouting", nftmodel.TypeNAT, nftmodel.HookPostrouting, 100,
				nlRule(nftmodel.MatchMark{Mask: 0x4000}, nftmodel.Verdict{Kind: nftmodel.Return}),
				nlRule(nftmodel.MarkXor{Bits: 0x4000}),
				nlRule(nftmodel.Masquerade{FullyRandom: true}),
				nlRule(nftmodel.MatchCtStatusDNAT{}, nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr, nftmodel.FieldDaddr}, Set: "hairpin"}, nftmodel.Masquerade{})),
			nlBase("filter-forward", nftmodel.TypeFilter, nftmodel.HookForward, 0,
				nlRule(nftmodel.MatchCtStateInvalid{}, nftmodel.Counter{}, nftmodel.Verdict{Kind: nftmodel.Drop}),
				nlRule(nftmodel.MatchFibDaddrLocal{}, nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldDaddr}, Set: "nodeport-ips"}, nftmodel.Verdict{Kind: nftmodel.Accept}),
				nlRule(nftmodel.MatchIifname{Name: "veth*"}, nftmodel.MatchL4Proto{Proto: 17}, nftmodel.MatchCtStateEstablished{Negate: true}, nftmodel.Verdict{Kind: nftmodel.Accept}),
				nlRule(nftmodel.Reject{TCPReset: true}),
				nlRule(nftmodel.Reject{})),
			nlBase("filter-input", nftmodel.TypeFilter, nftmodel.HookInput, -110,
				nlRule(nftmodel.MatchSet{Key: fwField, Set: "firewall-allow", Negate: true}, nftmodel.Verdict{Kind: nftmodel.Drop})),
			{Name: "svc-web", Rules: []nftmodel.Rule{
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("fd00:244::/64"), Negate: true}, nftmodel.MarkOr{Bits: 0x4000}),
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("fd00:240::/60")}, nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("fd00:96::10/128")}, nlJump("ep-web-1")),
				nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("fd00:1:2:3:4::/66")}, nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: "affinity"}, nlJump("ep-web-1")),
				{Exprs: []nftmodel.Expr{nftmodel.NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2"}}}, Comment: "default/web:http"},
			}},
			{Name: "ep-web-1", Rules: []nftmodel.Rule{
				nlRule(nftmodel.UpdateSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: "affinity"}),
				nlRule(nftmodel.MatchFibSaddrLocal{}, nftmodel.MarkOr{Bits: 0x4000}),
				nlRule(nftmodel.DNAT{Proto: 6, Addr: ip("fd00:244::2"), Port: 8080}),
			}},
			{Name: "ep-web-2", Rules: []nftmodel.Rule{nlRule(nftmodel.DNATMap{Key: svcKey, Map: "endpoints"})}},
			{Name: "svc-slots", Rules: []nftmodel.Rule{nlRule(nftmodel.DNATMap{Key: svcKey, Numgen: 2, Map: "slots"})}},
			// No UpdateMap: nft 1.0.6 can't load an IPv6 key and value that
			// long (TestUpdateMapIPv6ListsAsRendered).
			{Name: "affinity-lookup", Rules: []nftmodel.Rule{nlRule(nftmodel.DNATMap{Key: clientKey, Map: "client-affinity"})}},
		},
	}
}

// bigSetRuleset has one map with n elements, each with a comment.
func bigSetRuleset(n int) *nftmodel.Ruleset {
	rs := &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "nftproxy-big",
		Sets: []*nftmodel.Set{{Name: "endpoints", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}}},
	}
	for i := range n {
		rs.Sets[0].Elements = append(rs.Sets[0].Elements, nftmodel.Element{
			Key:     nlKey(fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&255, i&255), 6, 80),
			Data:    []nftmodel.Value{nftmodel.A(ip(fmt.Sprintf("10.%d.%d.%d", 160+i>>16, i>>8&255, i&255))), nftmodel.N(8080)},
			Comment: fmt.Sprintf("some-namespace/some-service-%d:http", i),
		})
	}
	return rs
}

// sizedSetRuleset has the sets compile declares with a size when they are
// large (the kernel then fills a hash table of fixed size), n elements each.
func sizedSetRuleset(n int) *nftmodel.Ruleset {
	endpoints := &nftmodel.Set{Name: "endpoints", Key: slotType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService},
		Typeof: &nftmodel.Typeof{Key: svcKey, KeyNumgen: 65536, Data: targetField}, Size: uint32(2 * n)}
	hairpin := &nftmodel.Set{Name: "hairpin", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeIPv4Addr}, Size: uint32(4 * n)}
	for i := range n {
		ep := nftmodel.A(ip(fmt.Sprintf("10.%d.%d.%d", 160+i>>16, i>>8&255, i&255)))
		endpoints.Elements = append(endpoints.Elements, nftmodel.Element{Key: slotKey("10.96.0.1", 6, 80, uint32(i)), Data: []nftmodel.Value{ep, nftmodel.N(8080)}})
		hairpin.Elements = append(hairpin.Elements, nftmodel.Element{Key: []nftmodel.Value{ep, ep}})
	}
	return &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "nftproxy-sized", Sets: []*nftmodel.Set{endpoints, hairpin}}
}

// sliceSource makes a list's elements one at a time, in the arrays it is
// given, as proxier's sources do.
type sliceSource []nftmodel.Element

func (s sliceSource) Len() int { return len(s) }

func (s sliceSource) Element(i int, e *nftmodel.Element) {
	*e = nftmodel.Element{Key: append(e.Key[:0], s[i].Key...), Data: append(e.Data[:0], s[i].Data...),
		Verdict: s[i].Verdict, Comment: s[i].Comment}
}

// sourcedSetRuleset is sizedSetRuleset with its elements made by sources,
// in more than one message each.
func sourcedSetRuleset(n int) *nftmodel.Ruleset {
	rs := sizedSetRuleset(n)
	rs.Table = "nftproxy-sourced"
	for _, s := range rs.Sets {
		s.Source, s.Elements = sliceSource(s.Elements), nil
	}
	return rs
}
