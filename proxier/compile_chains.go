// The chains every ruleset has: the base chains at the hooks and the fixed regular chains.

package proxier

import (
	"slices"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

func (c *compiler) baseChains() []*m.Chain {
	base := func(name string, t m.ChainType, h m.Hook, prio int32, rules ...m.Rule) *m.Chain {
		return &m.Chain{Name: name, Base: &m.BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules}
	}
	// No drop of the 0x8000 mark: kube-proxy v1.36 has none in any mode
	// (kubelet's KUBE-MARK-DROP is gone), so the bit may mean something else.
	var forward []m.Rule
	if c.cfg.DropInvalid {
		// Counted: nftproxy_ct_state_invalid_dropped_packets_total.
		forward = append(forward, m.Rule{Exprs: []m.Expr{m.MatchCtStateInvalid{}, m.Counter{}, m.Verdict{Kind: m.Drop}}})
	}
	// One rule for every load balancer's source ranges: a new connection
	// to a guarded address key from a source in none of its ranges is
	// dropped. Only new ones, as kube-proxy (ct state new): a connection
	// already open outlives a change of the ranges, and its packets skip
	// the two lookups.
	firewall := m.Rule{Exprs: []m.Expr{m.MatchCtStateEstablished{Negate: true}, m.MatchSet{Key: vipKey, Set: setFirewallIPs},
		m.MatchSet{Key: firewallKey, Set: setFirewallAllow, Negate: true}, m.Verdict{Kind: m.Drop}}}
	// Session affinity remembers where a new connection went, once DNAT
	// has chosen (in output for the node's own connections).
	remember := m.Rule{Exprs: []m.Expr{m.MatchCtStateEstablished{Negate: true}, m.MatchCtStatusDNAT{},
		m.Verdict{Kind: m.Jump, Chain: chainAffinityCheck}}}
	var input []m.Rule
	output := []m.Rule{jump(chainEndpointsCheck), remember}
	if guard, ok := c.localnetGuard(); ok {
		input = append([]m.Rule{guard}, input...)
		output = append([]m.Rule{guard}, output...)
	}
	chains := []*m.Chain{
		// Load-balancer source ranges at -110, before DNAT rewrites the
		// load balancer's address.
		base(chainFilterPreroutingPreDNAT, m.TypeFilter, m.HookPrerouting, -110, firewall),
		base(chainFilterOutputPreDNAT, m.TypeFilter, m.HookOutput, -110, firewall),
		// DNAT at dstnat (-100) for packets arriving and for the node's own.
		base(chainNATPrerouting, m.TypeNAT, m.HookPrerouting, -100, jump(chainServices)),
		base(chainNATOutput, m.TypeNAT, m.HookOutput, -100, jump(chainServices)),
		// Masquerade at srcnat (100), after routing picked the interface.
		base(chainNATPostrouting, m.TypeNAT, m.HookPostrouting, 100, jump(chainMasquerading)),
		// Refusals right after DNAT (-90) and before routing, so a service
		// port without endpoints is refused even where no route leads to
		// its address: only packets nothing rewrote still carry it.
		base(chainFilterPrerouting, m.TypeFilter, m.HookPrerouting, -90, jump(chainEndpointsCheck), remember),
		base(chainFilterInput, m.TypeFilter, m.HookInput, 0, input...),
		base(chainFilterForward, m.TypeFilter, m.HookForward, 0, forward...),
		base(chainFilterOutput, m.TypeFilter, m.HookOutput, 0, output...),
	}
	// A base chain without rules accepts everything: it would cost every
	// packet at its hook a call, and the sync a hook to register, for
	// nothing (input without the localnet guard, forward with tcpBeLiberal).
	return slices.DeleteFunc(chains, func(c *m.Chain) bool { return len(c.Rules) == 0 })
}

func (c *compiler) fixedChains() []*m.Chain {
	services := &m.Chain{Name: chainServices, Rules: []m.Rule{
		{Exprs: []m.Expr{m.VerdictMap{Key: vipKey, Map: mapServiceIPs}}},
	}}
	check := &m.Chain{Name: chainEndpointsCheck, Rules: []m.Rule{
		{Exprs: []m.Expr{m.VerdictMap{Key: vipKey, Map: mapNoEndpointServices}}},
	}}
	// After DNAT, a ClusterIP still in the destination is a port no service
	// has: refuse it. An address of the service CIDRs that no service has
	// goes nowhere: drop it.
	check.Rules = append(check.Rules, m.Rule{Exprs: []m.Expr{m.MatchSet{Key: []m.Field{m.FieldDaddr}, Set: setClusterIPs},
		m.Verdict{Kind: m.Goto, Chain: chainReject}}})
	for _, p := range c.cfg.ServiceCIDRs {
		if c.cfg.inFamily(p) {
			check.Rules = append(check.Rules, m.Rule{Exprs: []m.Expr{m.MatchPrefix{Field: m.FieldDaddr, Prefix: p.Masked()},
				m.Verdict{Kind: m.Drop}}})
		}
	}
	for _, match := range c.nodePortMatch() {
		services.Rules = append(services.Rules, m.Rule{Exprs: append(slices.Clone(match),
			m.VerdictMap{Key: nodePortKey, Map: mapServiceNodePorts})})
		check.Rules = append(check.Rules, m.Rule{Exprs: append(slices.Clone(match),
			m.VerdictMap{Key: nodePortKey, Map: mapNoEndpointNodePorts})})
	}
	return []*m.Chain{
		services,
		{Name: chainMarkForMasquerade, Rules: []m.Rule{{Exprs: []m.Expr{m.MarkOr{Bits: c.masqueradeMark()}}}}},
		{Name: chainMasquerading, Rules: []m.Rule{
			// Hairpin: an endpoint that reached itself through a service must
			// see the reply come from elsewhere, or it would answer itself.
			{Exprs: []m.Expr{m.MatchCtStatusDNAT{}, m.MatchSet{Key: []m.Field{m.FieldSaddr, m.FieldDaddr}, Set: setHairpin},
				m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}},
			{Exprs: []m.Expr{m.MatchMark{Mask: c.masqueradeMark()}, m.Verdict{Kind: m.Return}}},
			// Clear the bit so a packet that is routed again is not re-marked.
			{Exprs: []m.Expr{m.MarkXor{Bits: c.masqueradeMark()}}},
			{Exprs: []m.Expr{m.Masquerade{FullyRandom: true}}},
		}},
		check,
		c.affinityCheck(),
		{Name: chainReject, Rules: []m.Rule{
			{Exprs: []m.Expr{m.Reject{TCPReset: true}}},
			{Exprs: []m.Expr{m.Reject{}}},
		}},
	}
}
