package nftmodel

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Helpers to build small rulesets by hand.

func baseChain(name string, t ChainType, h Hook, prio int32, rules ...Rule) *Chain {
	return &Chain{Name: name, Base: &BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules}
}

func regular(name string, rules ...Rule) *Chain { return &Chain{Name: name, Rules: rules} }

func rule(exprs ...Expr) Rule { return Rule{Exprs: exprs} }

func jumpTo(c string) Verdict { return Verdict{Kind: Jump, Chain: c} }
func gotoTo(c string) Verdict { return Verdict{Kind: Goto, Chain: c} }

var (
	drop   = Verdict{Kind: Drop}
	accept = Verdict{Kind: Accept}
	ret    = Verdict{Kind: Return}
)

func dnatTo(addrPort string) DNAT {
	ap := netip.MustParseAddrPort(addrPort)
	return DNAT{Proto: 6, Addr: ap.Addr(), Port: ap.Port()}
}

func tableOf(chains ...*Chain) *Ruleset { return &Ruleset{Family: IPv4, Table: "t", Chains: chains} }

func withSets(rs *Ruleset, sets ...*Set) *Ruleset {
	rs.Sets = append(rs.Sets, sets...)
	return rs
}

func pre(rules ...Rule) *Chain { return baseChain("pre", TypeNAT, HookPrerouting, -100, rules...) }

// tcpPacket is a TCP packet from 10.0.0.1:40000 to dst, arriving from outside.
func tcpPacket(dst string) Packet {
	ap := netip.MustParseAddrPort(dst)
	return Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: ap.Addr(), Proto: 6, SrcPort: 40000, DstPort: ap.Port()}
}

func localAddrs(addrs ...string) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		for _, s := range addrs {
			if netip.MustParseAddr(s) == a {
				return true
			}
		}
		return false
	}
}

func eps(addrPorts ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range addrPorts {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

// TestTraceSteps checks control flow through the steps it reports.
func TestTraceSteps(t *testing.T) {
	tests := []struct {
		name string
		rs   *Ruleset
		p    Packet
		want []string
	}{
		{
			name: "jump comes back to the rule after it",
			rs: tableOf(
				pre(rule(jumpTo("sub")), rule(dnatTo("10.0.0.9:80"))),
				regular("sub", rule(MarkOr{Bits: 1})),
			),
			p: tcpPacket("10.0.0.5:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: jump sub",
				"sub: meta mark set meta mark | 0x00000001 -> mark 0x00000001",
				"sub: end of chain, back to pre",
				"pre: meta l4proto tcp dnat to 10.0.0.9:80 -> dnat to 10.0.0.9:80",
				"route: 10.0.0.9 is not local: forward",
				"verdict: accept, DNAT to 10.0.0.9:80",
			},
		},
		{
			name: "goto does not come back: its chain ends into the jumper's caller",
			rs: tableOf(
				pre(rule(jumpTo("a")), rule(dnatTo("10.0.0.9:80"))),
				regular("a", rule(gotoTo("b")), rule(drop)),
				regular("b"),
			),
			p: tcpPacket("10.0.0.5:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: jump a",
				"a: goto b",
				"b: end of chain, back to pre",
				"pre: meta l4proto tcp dnat to 10.0.0.9:80 -> dnat to 10.0.0.9:80",
				"route: 10.0.0.9 is not local: forward",
				"verdict: accept, DNAT to 10.0.0.9:80",
			},
		},
		{
			name: "goto from a base chain ends in its policy",
			rs:   tableOf(pre(rule(gotoTo("b")), rule(drop)), regular("b")),
			p:    tcpPacket("10.0.0.5:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: goto b",
				"b: end of chain, policy accept",
				"route: 10.0.0.5 is not local: forward",
				"verdict: accept",
			},
		},
		{
			name: "return goes back to the caller",
			rs:   tableOf(pre(rule(jumpTo("a")), rule(drop)), regular("a", rule(ret), rule(accept))),
			p:    tcpPacket("10.0.0.5:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: jump a",
				"a: return, back to pre",
				"pre: drop",
				"verdict: drop",
			},
		},
		{
			name: "accept ends only its base chain; base chains run by priority",
			rs: tableOf(
				baseChain("late", TypeFilter, HookPrerouting, 10, rule(drop)),
				baseChain("early", TypeFilter, HookPrerouting, -10, rule(jumpTo("a")), rule(drop)),
				regular("a", rule(accept)),
			),
			p: tcpPacket("10.0.0.5:80"),
			want: []string{
				"hook prerouting: early (type filter, priority -10)",
				"early: jump a",
				"a: accept",
				"hook prerouting: late (type filter, priority 10)",
				"late: drop",
				"verdict: drop",
			},
		},
		{
			name: "a local destination takes the input path, others forward and postrouting",
			rs: tableOf(
				baseChain("in", TypeFilter, HookInput, 0),
				baseChain("fwd", TypeFilter, HookForward, 0),
				baseChain("post", TypeNAT, HookPostrouting, 100),
			),
			p: func() Packet { p := tcpPacket("10.0.0.5:80"); p.Local = localAddrs("10.0.0.5"); return p }(),
			want: []string{
				"route: 10.0.0.5 is local: input",
				"hook input: in (type filter, priority 0)",
				"in: end of chain, policy accept",
				"verdict: accept",
			},
		},
		{
			name: "output to a local address comes back over loopback without NAT chains",
			rs: tableOf(
				baseChain("nat-out", TypeNAT, HookOutput, -100),
				baseChain("nat-pre", TypeNAT, HookPrerouting, -100, rule(drop)),
				baseChain("filter-pre", TypeFilter, HookPrerouting, 0),
				baseChain("post", TypeNAT, HookPostrouting, 100),
				baseChain("in", TypeFilter, HookInput, 0),
				baseChain("fwd", TypeFilter, HookForward, 0, rule(drop)),
			),
			p: func() Packet {
				p := tcpPacket("127.0.0.1:80")
				p.Hook, p.Local = HookOutput, localAddrs("127.0.0.1")
				return p
			}(),
			want: []string{
				"hook output: nat-out (type nat, priority -100)",
				"nat-out: end of chain, policy accept",
				"hook postrouting: post (type nat, priority 100)",
				"post: end of chain, policy accept",
				"route: 127.0.0.1 is local: back in over loopback",
				"hook prerouting (loopback): filter-pre (type filter, priority 0)",
				"filter-pre: end of chain, policy accept",
				"hook input (loopback): in (type filter, priority 0)",
				"in: end of chain, policy accept",
				"verdict: accept",
			},
		},
		{
			name: "numgen forks, and each branch's steps follow in turn",
			rs: tableOf(
				pre(rule(NumgenGoto{Chains: []string{"ep0", "ep1"}})),
				regular("ep0", rule(dnatTo("10.244.1.10:8080"))),
				regular("ep1", rule(dnatTo("10.244.1.11:8080"))),
			),
			p: tcpPacket("10.96.0.10:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: numgen random mod 2 vmap { 0 : goto ep0, 1 : goto ep1 } -> [0] goto ep0",
				"[0] ep0: meta l4proto tcp dnat to 10.244.1.10:8080 -> dnat to 10.244.1.10:8080",
				"[0] route: 10.244.1.10 is not local: forward",
				"[0] verdict: accept, DNAT to 10.244.1.10:8080",
				"pre: numgen random mod 2 vmap { 0 : goto ep0, 1 : goto ep1 } -> [1] goto ep1",
				"[1] ep1: meta l4proto tcp dnat to 10.244.1.11:8080 -> dnat to 10.244.1.11:8080",
				"[1] route: 10.244.1.11 is not local: forward",
				"[1] verdict: accept, DNAT to 10.244.1.11:8080",
			},
		},
		{
			name: "a numgen map lookup forks over the slots; a slot without an element is no match",
			rs: withSets(tableOf(
				pre(rule(DNATMap{Key: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Numgen: 2, Map: "slots"}), rule(drop)),
			),
				&Set{Name: "slots", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService, TypeInteger},
					Data: []DataType{TypeIPv4Addr, TypeInetService}, Elements: []Element{
						{Key: []Value{A(netip.MustParseAddr("10.96.0.10")), N(6), N(80), N(0)},
							Data: []Value{A(netip.MustParseAddr("10.244.1.10")), N(8080)}}}},
			),
			p: tcpPacket("10.96.0.10:80"),
			want: []string{
				"hook prerouting: pre (type nat, priority -100)",
				"pre: dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @slots -> [0] numgen 0",
				"[0] pre: dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @slots -> dnat to 10.244.1.10:8080",
				"[0] route: 10.244.1.10 is not local: forward",
				"[0] verdict: accept, DNAT to 10.244.1.10:8080",
				"pre: dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @slots -> [1] numgen 1",
				"[1] pre: drop",
				"[1] verdict: drop",
			},
		},
		{
			name: "a family the table does not handle is not seen",
			rs:   tableOf(pre(rule(drop))),
			p: Packet{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"),
				Proto: 6, DstPort: 80},
			want: []string{"table ip t: not an IPv4 packet, not seen", "verdict: accept"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Trace(tt.rs, tt.p)
			if diff := cmp.Diff(tt.want, got.Steps); diff != "" {
				t.Errorf("steps differ (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTrace checks outcomes: verdicts, DNAT targets and masquerade.
func TestTrace(t *testing.T) {
	vipKey := []Field{FieldDaddr, FieldL4Proto, FieldTHDport}
	vipT := []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}
	a := func(s string) Value { return A(netip.MustParseAddr(s)) }
	services := func() *Ruleset {
		return withSets(tableOf(
			pre(rule(VerdictMap{Key: vipKey, Map: "vips"}), rule(MatchL4Proto{Proto: 6}, drop)),
			regular("svc", rule(DNATMap{Key: vipKey, Map: "targets"})),
		),
			&Set{Name: "vips", Key: vipT, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: []Value{a("10.96.0.10"), N(6), N(80)}, Verdict: &Verdict{Kind: Goto, Chain: "svc"}}}},
			&Set{Name: "targets", Key: vipT, Data: []DataType{TypeIPv4Addr, TypeInetService}, Elements: []Element{
				{Key: []Value{a("10.96.0.10"), N(6), N(80)}, Data: []Value{a("10.244.1.10"), N(8080)}}}},
		)
	}
	// hairpin marks for masquerade in postrouting when a DNATed packet goes
	// back to its source, then masquerades what is marked.
	hairpin := func() *Ruleset {
		return withSets(tableOf(
			pre(rule(NumgenGoto{Chains: []string{"ep0", "ep1"}})),
			regular("ep0", rule(dnatTo("10.244.1.10:8080"))),
			regular("ep1", rule(dnatTo("10.244.1.11:8080"))),
			baseChain("post", TypeNAT, HookPostrouting, 100,
				rule(MatchCtStatusDNAT{}, MatchSet{Key: []Field{FieldSaddr, FieldDaddr}, Set: "hairpin"}, MarkOr{Bits: 0x4000}),
				rule(MatchMark{Mask: 0x4000}, ret),
				rule(MarkXor{Bits: 0x4000}),
				rule(Masquerade{FullyRandom: true})),
		),
			&Set{Name: "hairpin", Key: []DataType{TypeIPv4Addr, TypeIPv4Addr}, Elements: []Element{
				{Key: []Value{a("10.244.1.10"), a("10.244.1.10")}},
				{Key: []Value{a("10.244.1.11"), a("10.244.1.11")}}}},
		)
	}
	// firewall drops what goes to a guarded address, protocol and port
	// from outside its ranges: 192.0.2.1:80 allows 192.168.77.0/24 and
	// itself, 192.0.2.2:80 allows 10.0.0.0/8.
	firewall := func() *Ruleset {
		fwT := append(vipT[:3:3], TypeIPv4Addr)
		key := func(lb string, client string) []Value { return []Value{a(lb), N(6), N(80), a(client)} }
		return withSets(tableOf(
			baseChain("fw", TypeFilter, HookPrerouting, -110,
				rule(MatchSet{Key: vipKey, Set: "firewall-ips"}, MatchSet{Key: append(vipKey[:3:3], FieldSaddr), Set: "firewall-allow", Negate: true}, drop)),
		),
			&Set{Name: "firewall-ips", Key: vipT, Elements: []Element{
				{Key: []Value{a("192.0.2.1"), N(6), N(80)}}, {Key: []Value{a("192.0.2.2"), N(6), N(80)}}}},
			&Set{Name: "firewall-allow", Key: fwT, Interval: true, Elements: []Element{
				{Key: key("192.0.2.1", "192.168.77.0"), KeyEnd: key("192.0.2.1", "192.168.77.255")},
				{Key: key("192.0.2.1", "192.0.2.1")},
				{Key: key("192.0.2.2", "10.0.0.0"), KeyEnd: key("192.0.2.2", "10.255.255.255")}}},
		)
	}
	from := func(p Packet, src string) Packet { p.Src = netip.MustParseAddr(src); return p }
	withMark := func(p Packet, mark uint32) Packet { p.Mark = mark; return p }
	asUDP := func(p Packet) Packet { p.Proto = 17; return p }

	tests := []struct {
		name string
		rs   *Ruleset
		p    Packet
		want Outcome
	}{
		{
			name: "vmap hit goes to the service and DNATs through the data map",
			rs:   services(),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictAccept, Endpoints: eps("10.244.1.10:8080"),
				Branches: []Branch{{Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Verdict: VerdictAccept}}},
		},
		{
			name: "vmap miss falls through to the next rule",
			rs:   services(),
			p:    tcpPacket("10.96.0.10:81"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "data map miss falls through too",
			rs: func() *Ruleset {
				rs := services()
				rs.Sets[1].Elements = nil
				rs.Chains[1].Rules = append(rs.Chains[1].Rules, rule(Reject{}))
				return rs
			}(),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictReject, Branches: []Branch{{Verdict: VerdictReject}}},
		},
		{
			name: "source in an allowed range passes the firewall",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.1:80"), "192.168.77.9"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "source outside every range of its address is dropped",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.1:80"), "192.168.78.1"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "another address's range does not open this one",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.1:80"), "10.1.2.3"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "a range's last address is in it",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.2:80"), "10.255.255.255"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "a single allowed address",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.1:80"), "192.0.2.1"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "a port without ranges is open",
			rs:   firewall(),
			p:    from(tcpPacket("192.0.2.1:81"), "10.1.2.3"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "negated prefix matches a source outside it",
			rs:   tableOf(pre(rule(MatchPrefix{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.244.0.0/16"), Negate: true}, drop))),
			p:    from(tcpPacket("10.96.0.10:80"), "192.168.77.2"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "negated prefix does not match a source inside it",
			rs:   tableOf(pre(rule(MatchPrefix{Field: FieldSaddr, Prefix: netip.MustParsePrefix("10.244.0.0/16"), Negate: true}, drop))),
			p:    from(tcpPacket("10.96.0.10:80"), "10.244.1.50"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "mark set then matched",
			rs:   tableOf(pre(rule(MarkOr{Bits: 0x4000}), rule(MatchMark{Mask: 0x4000, IsSet: true}, drop))),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "mark set then cleared",
			rs: tableOf(pre(rule(MarkOr{Bits: 0x4000}), rule(MarkXor{Bits: 0x4000}),
				rule(MatchMark{Mask: 0x4000, IsSet: true}, drop))),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "the packet's own mark is matched, across hooks",
			rs:   tableOf(baseChain("fwd", TypeFilter, HookForward, 0, rule(MatchMark{Mask: 0x8000, IsSet: true}, drop))),
			p:    withMark(tcpPacket("10.96.0.10:80"), 0x8000),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "a statement runs even when a later match of its rule fails",
			rs: tableOf(pre(rule(MarkOr{Bits: 1}, MatchL4Proto{Proto: 17}, accept),
				rule(MatchMark{Mask: 1, IsSet: true}, drop))),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "fib daddr type local uses Packet.Local",
			rs:   tableOf(pre(rule(MatchFibDaddrLocal{}, drop))),
			p:    func() Packet { p := tcpPacket("192.168.77.1:30080"); p.Local = localAddrs("192.168.77.1"); return p }(),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "nothing is local without Packet.Local",
			rs:   tableOf(pre(rule(MatchFibDaddrLocal{}, drop))),
			p:    tcpPacket("192.168.77.1:30080"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "ct state invalid never matches a new packet",
			rs:   tableOf(pre(rule(MatchCtStateInvalid{}, drop))),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "ct status dnat does not match before a DNAT",
			rs:   tableOf(pre(rule(MatchCtStatusDNAT{}, drop))),
			p:    tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictAccept, Branches: []Branch{{Verdict: VerdictAccept}}},
		},
		{
			name: "TCP reset is only for TCP: UDP gets the next reject",
			rs:   tableOf(pre(rule(Reject{TCPReset: true}), rule(drop))),
			p:    asUDP(tcpPacket("10.96.0.53:53")),
			want: Outcome{Verdict: VerdictDrop, Branches: []Branch{{Verdict: VerdictDrop}}},
		},
		{
			name: "numgen explores all branches; endpoints sorted and de-duplicated",
			rs: tableOf(
				pre(rule(NumgenGoto{Chains: []string{"ep0", "ep1", "ep2"}})),
				regular("ep0", rule(dnatTo("10.244.1.11:8080"))),
				regular("ep1", rule(dnatTo("10.244.1.10:8080"))),
				regular("ep2", rule(dnatTo("10.244.1.11:8080"))),
			),
			p: tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: VerdictAccept, Endpoints: eps("10.244.1.10:8080", "10.244.1.11:8080"),
				Branches: []Branch{
					{Choices: []int{0}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictAccept},
					{Choices: []int{1}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Verdict: VerdictAccept},
					{Choices: []int{2}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictAccept},
				}},
		},
		{
			name: "branches with different verdicts; dropped ones reach no endpoint",
			rs: tableOf(
				pre(rule(NumgenGoto{Chains: []string{"ep0", "ep1"}})),
				regular("ep0", rule(dnatTo("10.244.1.10:8080"))),
				regular("ep1", rule(dnatTo("10.244.1.11:8080"))),
				baseChain("fwd", TypeFilter, HookForward, 0,
					rule(MatchPrefix{Field: FieldDaddr, Prefix: netip.MustParsePrefix("10.244.1.11/32")}, drop)),
			),
			p: tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: "accept|drop", Endpoints: eps("10.244.1.10:8080"),
				Branches: []Branch{
					{Choices: []int{0}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Verdict: VerdictAccept},
					{Choices: []int{1}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictDrop},
				}},
		},
		{
			name: "nested numgen labels every choice",
			rs: tableOf(
				pre(rule(NumgenGoto{Chains: []string{"a", "b"}})),
				regular("a", rule(NumgenGoto{Chains: []string{"ep0", "ep1"}})),
				regular("b", rule(drop)),
				regular("ep0", rule(dnatTo("10.244.1.10:8080"))),
				regular("ep1", rule(dnatTo("10.244.1.11:8080"))),
			),
			p: tcpPacket("10.96.0.10:80"),
			want: Outcome{Verdict: "accept|drop", Endpoints: eps("10.244.1.10:8080", "10.244.1.11:8080"),
				Branches: []Branch{
					{Choices: []int{0, 0}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Verdict: VerdictAccept},
					{Choices: []int{0, 1}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictAccept},
					{Choices: []int{1}, Verdict: VerdictDrop},
				}},
		},
		{
			name: "hairpin: only the branch back to the source is masqueraded",
			rs:   hairpin(),
			p:    from(tcpPacket("10.96.0.10:80"), "10.244.1.10"),
			want: Outcome{Verdict: VerdictAccept, Endpoints: eps("10.244.1.10:8080", "10.244.1.11:8080"), Masquerade: true,
				Branches: []Branch{
					{Choices: []int{0}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Masquerade: true, Verdict: VerdictAccept},
					{Choices: []int{1}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictAccept},
				}},
		},
		{
			name: "no hairpin from elsewhere",
			rs:   hairpin(),
			p:    from(tcpPacket("10.96.0.10:80"), "10.244.1.50"),
			want: Outcome{Verdict: VerdictAccept, Endpoints: eps("10.244.1.10:8080", "10.244.1.11:8080"),
				Branches: []Branch{
					{Choices: []int{0}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Verdict: VerdictAccept},
					{Choices: []int{1}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Verdict: VerdictAccept},
				}},
		},
		{
			name: "a mark set in prerouting is masqueraded in postrouting",
			rs: func() *Ruleset {
				rs := hairpin()
				rs.Chains[0].Rules = append([]Rule{rule(MarkOr{Bits: 0x4000})}, rs.Chains[0].Rules...)
				return rs
			}(),
			p: from(tcpPacket("10.96.0.10:80"), "10.244.1.50"),
			want: Outcome{Verdict: VerdictAccept, Endpoints: eps("10.244.1.10:8080", "10.244.1.11:8080"), Masquerade: true,
				Branches: []Branch{
					{Choices: []int{0}, Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Masquerade: true, Verdict: VerdictAccept},
					{Choices: []int{1}, Endpoint: netip.MustParseAddrPort("10.244.1.11:8080"), Masquerade: true, Verdict: VerdictAccept},
				}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Trace(tt.rs, tt.p)
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Outcome{}, "Steps"), cmpopts.EquateEmpty(),
				cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("outcome differs (-want +got):\n%s\nsteps:\n%s", diff, strings.Join(got.Steps, "\n"))
			}
		})
	}
}

// bogus is an expression the tracer does not know.
type bogus struct{}

func (bogus) isExpr() {}

func TestTracePanicsOnInvalidRulesets(t *testing.T) {
	tests := []struct {
		name string
		rs   *Ruleset
		want string
	}{
		{name: "unknown expression", rs: tableOf(pre(rule(bogus{}))), want: "unknown expression nftmodel.bogus"},
		{name: "missing chain", rs: tableOf(pre(rule(jumpTo("nowhere")))), want: `jump to missing chain "nowhere"`},
		{name: "missing set", rs: tableOf(pre(rule(MatchSet{Key: []Field{FieldDaddr}, Set: "nothing"}))),
			want: `lookup in missing set "nothing"`},
		{name: "goto loop", rs: tableOf(pre(rule(gotoTo("a"))), regular("a", rule(gotoTo("b"))), regular("b", rule(gotoTo("a")))),
			want: "a chain loop"},
		{name: "jump loop", rs: tableOf(pre(rule(jumpTo("a"))), regular("a", rule(jumpTo("a")))),
			want: "jumps nested deeper than 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if msg := fmt.Sprint(r); r == nil || !strings.Contains(msg, tt.want) {
					t.Errorf("panic = %v, want one containing %q", r, tt.want)
				}
			}()
			Trace(tt.rs, tcpPacket("10.96.0.10:80"))
		})
	}
}
