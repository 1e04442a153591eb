package nftmodel

import (
	"fmt"
	"net/netip"
	"time"
)

// Fixtures for the applier's tests: rulesets that between them use every
// expression, data type, verdict and base chain kind of the model, in both
// families.

var (
	vipType  = []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}
	vip6Type = []DataType{TypeIPv6Addr, TypeInetProto, TypeInetService}
	svcKey   = []Field{FieldDaddr, FieldL4Proto, FieldTHDport}
	slotType = []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService, TypeInteger}
)

func slotKey(a string, p, port, slot uint32) []Value {
	return []Value{A(ip(a)), N(p), N(port), N(slot)}
}

func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }
func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func nlGoto(c string) *Verdict  { return &Verdict{Kind: Goto, Chain: c} }
func nlJump(c string) Verdict   { return Verdict{Kind: Jump, Chain: c} }
func nlRule(e ...Expr) Rule     { return Rule{Exprs: e} }
func nlKey(a string, p, port uint32) []Value {
	return []Value{A(ip(a)), N(p), N(port)}
}

func nlBase(name string, t ChainType, h Hook, prio int32, rules ...Rule) *Chain {
	return &Chain{Name: name, Base: &BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules}
}

// fullRuleset is an IPv4 table using every expression and every kind of set.
func fullRuleset() *Ruleset {
	return &Ruleset{Family: IPv4, Table: "nftproxy-test",
		Sets: []*Set{
			{Name: "service-ips", Key: vipType, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: nlKey("10.96.0.10", 6, 80), Comment: "default/web:http", Verdict: nlGoto("svc-web")},
				{Key: nlKey("10.96.0.10", 17, 53), Comment: "kube-system/dns:dns", Verdict: nlGoto("svc-dns")},
				{Key: nlKey("10.96.0.11", 132, 9000), Verdict: &Verdict{Kind: Jump, Chain: "reject-chain"}},
				{Key: nlKey("10.96.0.12", 6, 443), Verdict: &Verdict{Kind: Drop}},
				{Key: nlKey("10.96.0.13", 6, 443), Verdict: &Verdict{Kind: Accept}},
				{Key: nlKey("10.96.0.14", 6, 443), Verdict: &Verdict{Kind: Return}},
			}},
			{Name: "service-nodeports", Key: []DataType{TypeInetProto, TypeInetService}, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: []Value{N(6), N(30080)}, Comment: "default/web:http", Verdict: nlGoto("svc-web")},
			}},
			{Name: "endpoints", Key: vipType, Data: []DataType{TypeIPv4Addr, TypeInetService}, Elements: []Element{
				{Key: nlKey("10.96.0.10", 6, 80), Data: []Value{A(ip("10.244.1.2")), N(8080)}, Comment: "default/web:http"},
				{Key: nlKey("10.96.0.10", 17, 53), Data: []Value{A(ip("10.244.2.3")), N(53)}},
			}},
			{Name: "hairpin", Key: []DataType{TypeIPv4Addr, TypeIPv4Addr}, Elements: []Element{
				{Key: []Value{A(ip("10.244.1.2")), A(ip("10.244.1.2"))}, Comment: "default/web"},
				{Key: []Value{A(ip("10.244.2.3")), A(ip("10.244.2.3"))}},
			}},
			{Name: "nodeport-ips", Key: []DataType{TypeIPv4Addr}, Elements: []Element{
				{Key: []Value{A(ip("192.168.1.10"))}},
				{Key: []Value{A(ip("10.0.0.5"))}, Comment: "node"},
				{Key: []Value{A(ip("10.0.0.6"))}},
				{Key: []Value{A(ip("10.0.0.7"))}},
			}},
			{Name: "ports", Key: []DataType{TypeInetService}, Elements: []Element{
				{Key: []Value{N(1)}}, {Key: []Value{N(2)}}, {Key: []Value{N(3)}}, {Key: []Value{N(4)}},
				{Key: []Value{N(5)}, Comment: "five"}, {Key: []Value{N(6)}}, {Key: []Value{N(7)}},
			}},
			{Name: "port-verdicts", Key: []DataType{TypeInetService}, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: []Value{N(22)}, Verdict: &Verdict{Kind: Accept}},
			}},
			{Name: "protos", Key: []DataType{TypeInetProto}, Elements: []Element{{Key: []Value{N(6)}}, {Key: []Value{N(17)}}, {Key: []Value{N(132)}}}},
			{Name: "affinity", Key: []DataType{TypeIPv4Addr}, Timeout: 3 * time.Hour},
			{Name: "affinity-ports", Key: []DataType{TypeIPv4Addr, TypeInetService}, Timeout: 10800 * time.Second},
			{Name: "empty-map", Key: vipType, Data: []DataType{TypeIPv4Addr, TypeInetService}},
			{Name: "slots", Key: slotType, Data: []DataType{TypeIPv4Addr, TypeInetService},
				Typeof: &Typeof{Key: svcKey, KeyNumgen: 65536, Data: []Field{FieldDaddr, FieldTHDport}}, Elements: []Element{
					{Key: slotKey("10.96.0.10", 6, 80, 0), Data: []Value{A(ip("10.244.1.2")), N(8080)}, Comment: "default/web:http"},
					{Key: slotKey("10.96.0.10", 6, 80, 1), Data: []Value{A(ip("10.244.1.3")), N(8080)}},
					{Key: slotKey("10.96.0.10", 6, 80, 256), Data: []Value{A(ip("10.244.1.4")), N(8080)}},
					{Key: slotKey("10.96.0.10", 6, 80, 300), Data: []Value{A(ip("10.244.1.5")), N(8080)}},
					{Key: slotKey("10.96.0.9", 17, 53, 2), Data: []Value{A(ip("10.244.2.3")), N(53)}},
				}},
			{Name: "node-port-slots", Key: []DataType{TypeInetProto, TypeInetService, TypeInteger}, Data: []DataType{TypeIPv4Addr, TypeInetService},
				Typeof: &Typeof{Key: []Field{FieldL4Proto, FieldTHDport}, KeyNumgen: 1, Data: []Field{FieldDaddr, FieldTHDport}}, Elements: []Element{
					{Key: []Value{N(6), N(30080), N(0)}, Data: []Value{A(ip("10.244.1.2")), N(8080)}},
				}},
			{Name: "pairs", Key: []DataType{TypeIPv4Addr, TypeIPv4Addr}, Typeof: &Typeof{Key: []Field{FieldSaddr, FieldDaddr}}, Elements: []Element{
				{Key: []Value{A(ip("10.244.1.2")), A(ip("10.244.1.2"))}},
			}},
		},
		Chains: []*Chain{
			nlBase("nat-prerouting", TypeNAT, HookPrerouting, -100, nlRule(nlJump("services"))),
			nlBase("nat-output", TypeNAT, HookOutput, -100, nlRule(nlJump("services"))),
			nlBase("nat-postrouting", TypeNAT, HookPostrouting, 100, nlRule(nlJump("masquerading"))),
			nlBase("filter-prerouting-pre-dnat", TypeFilter, HookPrerouting, -110,
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.240.0.0/12")}, MatchPrefix{Field: FieldDaddr, Prefix: pfx("10.96.0.10/32")}, Verdict{Kind: Drop})),
			nlBase("filter-output-pre-dnat", TypeFilter, HookOutput, -110,
				nlRule(MatchPrefix{Field: FieldDaddr, Prefix: pfx("0.0.0.0/0")}, MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.0.0.0/8"), Negate: true}, Verdict{Kind: Accept})),
			nlBase("filter-input", TypeFilter, HookInput, 0,
				nlRule(MatchCtStateInvalid{}, Verdict{Kind: Drop}),
				nlRule(MatchPrefix{Field: FieldDaddr, Prefix: pfx("127.0.0.0/8")}, MatchPrefix{Field: FieldSaddr, Prefix: pfx("127.0.0.0/8"), Negate: true},
					MatchCtStateEstablished{Negate: true}, MatchCtStatusDNAT{Negate: true}, Verdict{Kind: Drop}),
				nlRule(MatchCtStateEstablished{}, MatchCtStatusDNAT{}, Verdict{Kind: Accept}),
				nlRule(MatchIifname{Name: "br0"}, Verdict{Kind: Return}),
				nlRule(MatchIifname{Name: "veth*", Negate: true}, Verdict{Kind: Return}),
				nlRule(MatchIifname{Name: "cali*"}, Verdict{Kind: Accept}),
				nlRule(MatchIifname{Name: "eth0", Negate: true}, Verdict{Kind: Accept})),
			nlBase("filter-forward", TypeFilter, HookForward, 0,
				nlRule(MatchCtStateInvalid{}, Counter{}, Verdict{Kind: Drop}),
				nlRule(MatchMark{Mask: 0x8000, IsSet: true}, Verdict{Kind: Drop})),
			nlBase("filter-output", TypeFilter, HookOutput, 0, nlRule(nlJump("reject-chain"))),
			{Name: "services", Rules: []Rule{
				nlRule(VerdictMap{Key: svcKey, Map: "service-ips"}),
				nlRule(MatchFibDaddrLocal{}, VerdictMap{Key: []Field{FieldL4Proto, FieldTHDport}, Map: "service-nodeports"}),
				nlRule(MatchSet{Key: []Field{FieldDaddr}, Set: "nodeport-ips"}, VerdictMap{Key: []Field{FieldL4Proto, FieldTHDport}, Map: "service-nodeports"}),
				nlRule(VerdictMap{Key: []Field{FieldTHDport}, Map: "port-verdicts"}),
				{Exprs: []Expr{MatchSet{Key: []Field{FieldL4Proto}, Set: "protos"}, MatchSet{Key: []Field{FieldSaddr}, Set: "affinity"}, Verdict{Kind: Accept}}, Comment: "sets"},
				nlRule(MatchSet{Key: []Field{FieldSaddr, FieldTHDport}, Set: "affinity-ports"}, Verdict{Kind: Return}),
			}},
			{Name: "mark-for-masquerade", Rules: []Rule{nlRule(MarkOr{Bits: 0x4000})}},
			{Name: "masquerading", Rules: []Rule{
				nlRule(MatchMark{Mask: 0x4000}, Verdict{Kind: Return}),
				nlRule(MarkXor{Bits: 0x4000}),
				{Exprs: []Expr{Masquerade{FullyRandom: true}}, Comment: "masquerade"},
				nlRule(MatchCtStatusDNAT{}, MatchSet{Key: []Field{FieldSaddr, FieldDaddr}, Set: "hairpin"}, Masquerade{}),
			}},
			{Name: "svc-web", Rules: []Rule{
				{Exprs: []Expr{MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.244.0.0/16"), Negate: true}, nlJump("mark-for-masquerade")}, Comment: "default/web:http cluster IP"},
				{Exprs: []Expr{NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2", "ep-web-3"}}}, Comment: "default/web:http"},
			}},
			{Name: "svc-dns", Rules: []Rule{
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.244.0.0/20"), Negate: true}, nlJump("mark-for-masquerade")),
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.2.0.0/15")}, Verdict{Kind: Goto, Chain: "ep-dns"}),
				nlRule(NumgenGoto{Chains: []string{"ep-dns"}}),
				nlRule(NumgenGoto{Chains: []string{"ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns", "ep-dns"}}),
			}},
			{Name: "ep-web-1", Rules: []Rule{
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.244.1.2/32")}, nlJump("mark-for-masquerade")),
				{Exprs: []Expr{DNAT{Proto: 6, Addr: ip("10.244.1.2"), Port: 8080}}, Comment: "default/web:http"},
			}},
			{Name: "ep-web-2", Rules: []Rule{
				nlRule(UpdateSet{Key: []Field{FieldSaddr}, Set: "affinity"}),
				nlRule(MatchFibSaddrLocal{}, nlJump("mark-for-masquerade")),
				nlRule(DNAT{Proto: 6, Addr: ip("10.244.1.3"), Port: 8080}),
			}},
			{Name: "ep-web-3", Rules: []Rule{nlRule(DNAT{Proto: 132, Addr: ip("10.244.1.4"), Port: 1})}},
			{Name: "ep-dns", Rules: []Rule{
				nlRule(DNATMap{Key: svcKey, Map: "endpoints"}),
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("10.244.0.0/16")}, DNATMap{Key: svcKey, Numgen: 3, Map: "slots"}),
				nlRule(DNATMap{Key: svcKey, Numgen: 1, Map: "slots"}),
				nlRule(DNATMap{Key: []Field{FieldL4Proto, FieldTHDport}, Numgen: 5000, Map: "node-port-slots"}),
				nlRule(DNAT{Proto: 17, Addr: ip("10.244.2.3"), Port: 53}),
			}},
			{Name: "reject-chain", Rules: []Rule{
				nlRule(MatchPrefix{Field: FieldDaddr, Prefix: pfx("10.96.0.11/32")}, Reject{TCPReset: true}),
				nlRule(MatchL4Proto{Proto: 17}, Reject{}),
				nlRule(Reject{}),
			}},
			{Name: "empty"},
		},
	}
}

// full6Ruleset is the IPv6 counterpart, smaller but with every
// family-specific encoding: addresses, prefixes, DNAT, the DNAT map, reject.
func full6Ruleset() *Ruleset {
	key := func(a string, p, port uint32) []Value { return []Value{A(ip(a)), N(p), N(port)} }
	return &Ruleset{Family: IPv6, Table: "nftproxy-test6",
		Sets: []*Set{
			{Name: "service-ips", Key: vip6Type, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: key("fd00:96::10", 6, 80), Comment: "default/web:http", Verdict: nlGoto("svc-web")},
				{Key: key("fd00:96::11", 17, 53), Verdict: &Verdict{Kind: Drop}},
			}},
			{Name: "endpoints", Key: vip6Type, Data: []DataType{TypeIPv6Addr, TypeInetService}, Elements: []Element{
				{Key: key("fd00:96::10", 6, 80), Data: []Value{A(ip("fd00:244::2")), N(8080)}, Comment: "default/web:http"},
			}},
			{Name: "hairpin", Key: []DataType{TypeIPv6Addr, TypeIPv6Addr}, Elements: []Element{
				{Key: []Value{A(ip("fd00:244::2")), A(ip("fd00:244::2"))}},
			}},
			{Name: "nodeport-ips", Key: []DataType{TypeIPv6Addr}, Elements: []Element{{Key: []Value{A(ip("2001:db8::1"))}}}},
			{Name: "affinity", Key: []DataType{TypeIPv6Addr}, Timeout: 90 * time.Minute},
			{Name: "slots", Key: []DataType{TypeIPv6Addr, TypeInetProto, TypeInetService, TypeInteger}, Data: []DataType{TypeIPv6Addr, TypeInetService},
				Typeof: &Typeof{Key: svcKey, KeyNumgen: 65536, Data: []Field{FieldDaddr, FieldTHDport}}, Elements: []Element{
					{Key: []Value{A(ip("fd00:96::10")), N(6), N(80), N(0)}, Data: []Value{A(ip("fd00:244::2")), N(8080)}},
					{Key: []Value{A(ip("fd00:96::10")), N(6), N(80), N(1)}, Data: []Value{A(ip("fd00:244::3")), N(8080)}, Comment: "default/web:http"},
				}},
			{Name: "pairs", Key: []DataType{TypeIPv6Addr, TypeIPv6Addr}, Typeof: &Typeof{Key: []Field{FieldSaddr, FieldDaddr}}},
		},
		Chains: []*Chain{
			nlBase("nat-prerouting", TypeNAT, HookPrerouting, -100, nlRule(VerdictMap{Key: svcKey, Map: "service-ips"})),
			nlBase("nat-output", TypeNAT, HookOutput, -100, nlRule(VerdictMap{Key: svcKey, Map: "service-ips"})),
			nlBase("nat-postrouting", TypeNAT, HookPostrouting, 100,
				nlRule(MatchMark{Mask: 0x4000}, Verdict{Kind: Return}),
				nlRule(MarkXor{Bits: 0x4000}),
				nlRule(Masquerade{FullyRandom: true}),
				nlRule(MatchCtStatusDNAT{}, MatchSet{Key: []Field{FieldSaddr, FieldDaddr}, Set: "hairpin"}, Masquerade{})),
			nlBase("filter-forward", TypeFilter, HookForward, 0,
				nlRule(MatchCtStateInvalid{}, Verdict{Kind: Drop}),
				nlRule(MatchFibDaddrLocal{}, MatchSet{Key: []Field{FieldDaddr}, Set: "nodeport-ips"}, Verdict{Kind: Accept}),
				nlRule(Reject{TCPReset: true}),
				nlRule(Reject{})),
			nlBase("filter-input", TypeFilter, HookInput, -110),
			{Name: "svc-web", Rules: []Rule{
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("fd00:244::/64"), Negate: true}, MarkOr{Bits: 0x4000}),
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("fd00:240::/60")}, MatchPrefix{Field: FieldDaddr, Prefix: pfx("fd00:96::10/128")}, nlJump("ep-web-1")),
				nlRule(MatchPrefix{Field: FieldSaddr, Prefix: pfx("fd00:1:2:3:4::/66")}, MatchSet{Key: []Field{FieldSaddr}, Set: "affinity"}, nlJump("ep-web-1")),
				{Exprs: []Expr{NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2"}}}, Comment: "default/web:http"},
			}},
			{Name: "ep-web-1", Rules: []Rule{
				nlRule(UpdateSet{Key: []Field{FieldSaddr}, Set: "affinity"}),
				nlRule(MatchFibSaddrLocal{}, MarkOr{Bits: 0x4000}),
				nlRule(DNAT{Proto: 6, Addr: ip("fd00:244::2"), Port: 8080}),
			}},
			{Name: "ep-web-2", Rules: []Rule{nlRule(DNATMap{Key: svcKey, Map: "endpoints"})}},
			{Name: "svc-slots", Rules: []Rule{nlRule(DNATMap{Key: svcKey, Numgen: 2, Map: "slots"})}},
		},
	}
}

// bigSetRuleset has one map with n elements, each with a comment.
func bigSetRuleset(n int) *Ruleset {
	rs := &Ruleset{Family: IPv4, Table: "nftproxy-big",
		Sets: []*Set{{Name: "endpoints", Key: vipType, Data: []DataType{TypeIPv4Addr, TypeInetService}}},
	}
	for i := range n {
		rs.Sets[0].Elements = append(rs.Sets[0].Elements, Element{
			Key:     nlKey(fmt.Sprintf("10.%d.%d.%d", 96+i>>16, i>>8&255, i&255), 6, 80),
			Data:    []Value{A(ip(fmt.Sprintf("10.%d.%d.%d", 160+i>>16, i>>8&255, i&255))), N(8080)},
			Comment: fmt.Sprintf("some-namespace/some-service-%d:http", i),
		})
	}
	return rs
}
