package features

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// The features nftproxy's ruleset and flow cleanup use. MinKernel is the
// release that added the feature, from the nftables wiki's list of kernel
// updates and nft's release notes; where a feature came in pieces, the last
// piece nftproxy needs. The probes themselves decide: only Linux 6.18 has
// run them here, so a MinKernel is what the refusal tells the operator to
// look for, not something a test has shown.
var (
	FilterChains = &Feature{Name: "filter base chains on prerouting, input, forward and output", MinKernel: "3.13",
		program: func(b *build) { b.filterChains() }}
	// Before 4.18 an nftables nat chain and iptables' nat table could not
	// be used at once, which the migration from kube-proxy needs.
	NATChains = &Feature{Name: "nat base chains on prerouting, output and postrouting", MinKernel: "4.18",
		program: func(b *build) { b.natChains() }}
	Matches = &Feature{Name: "address, meta l4proto, iifname and mark matches, meta mark set and rule comments",
		MinKernel: "5.3", program: programMatches}
	// nftproxy matches th dport only in keys, so it is probed here.
	ConcatMaps = &Feature{Name: "verdict maps and sets with concatenated keys and element comments", MinKernel: "4.1",
		program: programConcatMaps}
	Numgen = &Feature{Name: "numgen random with an anonymous verdict map", MinKernel: "4.9", program: programNumgen}
	Fib    = &Feature{Name: "fib daddr type and fib saddr type", MinKernel: "4.10", program: programFib}
	Ct     = &Feature{Name: "ct state and ct status", MinKernel: "3.13", program: programCt}
	// Session affinity: a map with timeouts that the packet path fills from
	// conntrack (`update @affinity { ip saddr . ct original ip daddr . … :
	// ct reply ip saddr . ct reply proto-src }`) and DNAT from it. The
	// typed conntrack addresses (NFT_CT_SRC_IP and the like) came with
	// 4.17, by our reading of the kernel's history (not checked on such a
	// kernel); the DNAT map needs 5.6 anyway.
	Timeouts = &Feature{Name: "maps with timeouts filled from conntrack by the packet path", MinKernel: "4.17", program: programTimeouts}
	// The endpoints map: typeof user data, a key ending in numgen, and
	// values of address . port (20 bytes for IPv6: set data over 16 bytes
	// came with 5.6).
	DNATMap = &Feature{Name: "dnat to address . port from a typeof map keyed with numgen", MinKernel: "5.6",
		program: programDNATMap}
	// Load-balancer source ranges: one interval set of concatenations
	// (the kernel's pipapo, 5.6) holding every guarded address . protocol
	// . port . allowed range, matched negated.
	IntervalConcat = &Feature{Name: "interval sets with concatenated keys, matched negated", MinKernel: "5.6",
		program: programIntervalConcat}
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
	return []*Feature{FilterChains, NATChains, Matches, ConcatMaps, Numgen, Fib, Ct, Timeouts, DNATMap, IntervalConcat, Masquerade, Reject, Notifications}
}

// Priorities of nftproxy's base chains.
const (
	prioPreDNAT   = -110
	prioDNAT      = -100
	prioPostDNAT  = -90
	prioFilter    = 0
	prioSourceNAT = 100
)

// build is one family's probe table while a feature describes it.
type build struct{ rs *m.Ruleset }

func (b *build) chain(name string, typ m.ChainType, hook m.Hook, prio int32) *m.Chain {
	c := &m.Chain{Name: name, Base: &m.BaseChain{Type: typ, Hook: hook, Priority: prio}}
	b.rs.Chains = append(b.rs.Chains, c)
	return c
}

func (b *build) regular(name string) *m.Chain {
	c := &m.Chain{Name: name}
	b.rs.Chains = append(b.rs.Chains, c)
	return c
}

func (b *build) set(s *m.Set) { b.rs.Sets = append(b.rs.Sets, s) }

func rule(c *m.Chain, exprs ...m.Expr) { c.Rules = append(c.Rules, m.Rule{Exprs: exprs}) }

// filterChains adds the filter base chains nftproxy has, and returns the
// ones rules are put in: prerouting after DNAT, forward and output.
func (b *build) filterChains() (pre, fwd, out *m.Chain) {
	b.chain("pre-dnat", m.TypeFilter, m.HookPrerouting, prioPreDNAT)
	pre = b.chain("prerouting", m.TypeFilter, m.HookPrerouting, prioPostDNAT)
	b.chain("input", m.TypeFilter, m.HookInput, prioFilter)
	fwd = b.chain("forward", m.TypeFilter, m.HookForward, prioFilter)
	b.chain("output-pre-dnat", m.TypeFilter, m.HookOutput, prioPreDNAT)
	out = b.chain("output", m.TypeFilter, m.HookOutput, prioFilter)
	return pre, fwd, out
}

// natChains adds the nat base chains and returns them.
func (b *build) natChains() (pre, out, post *m.Chain) {
	pre = b.chain("nat-prerouting", m.TypeNAT, m.HookPrerouting, prioDNAT)
	out = b.chain("nat-output", m.TypeNAT, m.HookOutput, prioDNAT)
	post = b.chain("nat-postrouting", m.TypeNAT, m.HookPostrouting, prioSourceNAT)
	return pre, out, post
}

func (b *build) addrType() m.DataType {
	if b.rs.Family == m.IPv6 {
		return m.TypeIPv6Addr
	}
	return m.TypeIPv4Addr
}

// addr returns a documentation address of the family.
func (b *build) addr() netip.Addr {
	if b.rs.Family == m.IPv6 {
		return netip.MustParseAddr("2001:db8::1")
	}
	return netip.MustParseAddr("192.0.2.1")
}

// The service key daddr . l4proto . th dport, its types and a value.
var serviceKey = []m.Field{m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport}

func (b *build) serviceKeyTypes() []m.DataType {
	return []m.DataType{b.addrType(), m.TypeInetProto, m.TypeInetService}
}

func (b *build) serviceKeyValue() []m.Value {
	return []m.Value{m.A(b.addr()), m.N(unix.IPPROTO_TCP), m.N(80)}
}

func programMatches(b *build) {
	pre, _, _ := b.filterChains()
	pre.Rules = append(pre.Rules, m.Rule{Comment: "default/probe:http", Exprs: []m.Expr{
		m.MatchPrefix{Field: m.FieldDaddr, Prefix: netip.PrefixFrom(b.addr(), 24).Masked()},
		m.MatchL4Proto{Proto: unix.IPPROTO_TCP},
		m.MatchIifname{Name: "veth*", Negate: true},
		m.MatchMark{Mask: 0x4000, IsSet: false},
		m.MarkOr{Bits: 0x4000},
	}})
}

func programConcatMaps(b *build) {
	pre, _, post := b.natChains()
	target := b.regular("target")
	rule(target, m.Verdict{Kind: m.Accept})
	b.set(&m.Set{Name: "service-ips", Key: b.serviceKeyTypes(), Data: []m.DataType{m.TypeVerdict},
		Elements: []m.Element{{Key: b.serviceKeyValue(), Comment: "default/probe:http",
			Verdict: &m.Verdict{Kind: m.Goto, Chain: target.Name}}}})
	rule(pre, m.VerdictMap{Key: serviceKey, Map: "service-ips"})
	b.set(&m.Set{Name: "hairpin", Key: []m.DataType{b.addrType(), b.addrType()},
		Elements: []m.Element{{Key: []m.Value{m.A(b.addr()), m.A(b.addr())}}}})
	rule(post, m.MatchSet{Key: []m.Field{m.FieldSaddr, m.FieldDaddr}, Set: "hairpin"}, m.Verdict{Kind: m.Jump, Chain: target.Name})
}

func programNumgen(b *build) {
	pre, _, _ := b.natChains()
	ep0, ep1 := b.regular("endpoint-0"), b.regular("endpoint-1")
	rule(pre, m.NumgenGoto{Chains: []string{ep0.Name, ep1.Name}})
}

func programFib(b *build) {
	pre, _, out := b.filterChains()
	rule(pre, m.MatchFibDaddrLocal{})
	rule(out, m.MatchFibSaddrLocal{})
}

func programCt(b *build) {
	_, fwd, _ := b.filterChains()
	_, _, post := b.natChains()
	rule(fwd, m.MatchCtStateInvalid{}, m.Counter{}, m.Verdict{Kind: m.Drop})
	rule(post, m.MatchCtStatusDNAT{}, m.MatchCtStateEstablished{Negate: true})
}

// programTimeouts declares and uses the affinity map as nftproxy does.
func programTimeouts(b *build) {
	pre, _, _ := b.natChains()
	fpre, _, _ := b.filterChains()
	addr := b.addrType()
	client := []m.Field{m.FieldSaddr, m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport}
	b.set(&m.Set{Name: "affinity", Key: []m.DataType{addr, addr, m.TypeInetProto, m.TypeInetService},
		Data: []m.DataType{addr, m.TypeInetService}, Timeout: 3 * time.Hour, Size: 1 << 20,
		Typeof: &m.Typeof{Key: client, Data: []m.Field{m.FieldDaddr, m.FieldTHDport}}})
	rule(pre, m.DNATMap{Key: client, Map: "affinity"})
	rule(fpre, m.MatchL4Proto{Proto: unix.IPPROTO_TCP}, m.UpdateMap{
		Key:  []m.Field{m.FieldSaddr, m.FieldCtOriginalDaddr, m.FieldL4Proto, m.FieldCtOriginalProtoDst},
		Data: []m.Field{m.FieldCtReplySaddr, m.FieldCtReplyProtoSrc}, Map: "affinity", Timeout: time.Hour})
}

// programDNATMap declares the map as nftproxy declares its endpoints map,
// so that the kernel is asked to keep as many bytes of user data:
//
//	typeof ip daddr . meta l4proto . th dport . numgen random mod 65536 : ip daddr . th dport
func programDNATMap(b *build) {
	pre, _, _ := b.natChains()
	endpoint := []m.Value{m.A(b.addr()), m.N(8080)}
	b.set(&m.Set{Name: "endpoints",
		Key:  append(b.serviceKeyTypes(), m.TypeInteger),
		Data: []m.DataType{b.addrType(), m.TypeInetService},
		Typeof: &m.Typeof{Key: serviceKey, KeyNumgen: 65536,
			Data: []m.Field{m.FieldDaddr, m.FieldTHDport}},
		Elements: []m.Element{
			{Key: append(b.serviceKeyValue(), m.N(0)), Data: endpoint},
			{Key: append(b.serviceKeyValue(), m.N(1)), Data: endpoint},
		}})
	rule(pre, m.DNATMap{Key: serviceKey, Numgen: 2, Map: "endpoints"})
	rule(pre, m.DNATMap{Key: serviceKey, Numgen: 1, Offset: 65536, Map: "endpoints"})
}

// programIntervalConcat declares and matches the firewall's sets as
// nftproxy does:
//
//	ip daddr . meta l4proto . th dport @firewall-ips ip daddr . meta l4proto . th dport . ip saddr != @firewall-allow drop
func programIntervalConcat(b *build) {
	pre, _, _ := b.filterChains()
	b.set(&m.Set{Name: "firewall-ips", Key: b.serviceKeyTypes(), Elements: []m.Element{{Key: b.serviceKeyValue()}}})
	// A range beside the single address: ranges of one key must not overlap.
	allowed := netip.MustParsePrefix("198.51.100.0/24")
	if b.rs.Family == m.IPv6 {
		allowed = netip.MustParsePrefix("2001:db8:1::/64")
	}
	b.set(&m.Set{Name: "firewall-allow", Key: append(b.serviceKeyTypes(), b.addrType()), Interval: true,
		Elements: []m.Element{
			{Key: append(b.serviceKeyValue(), m.A(allowed.Addr())), KeyEnd: append(b.serviceKeyValue(), m.A(m.LastAddr(allowed)))},
			{Key: append(b.serviceKeyValue(), m.A(b.addr()))},
		}})
	rule(pre, m.MatchSet{Key: serviceKey, Set: "firewall-ips"},
		m.MatchSet{Key: append(serviceKey[:3:3], m.FieldSaddr), Set: "firewall-allow", Negate: true}, m.Verdict{Kind: m.Drop})
}

func programMasquerade(b *build) {
	_, _, post := b.natChains()
	rule(post, m.Masquerade{FullyRandom: true})
}

func programReject(b *build) {
	pre, _, out := b.filterChains()
	reject := b.regular("reject-chain")
	rule(pre, m.Verdict{Kind: m.Jump, Chain: reject.Name})
	rule(out, m.Verdict{Kind: m.Jump, Chain: reject.Name})
	rule(reject, m.MatchL4Proto{Proto: unix.IPPROTO_TCP}, m.Reject{TCPReset: true})
	rule(reject, m.Reject{})
}
