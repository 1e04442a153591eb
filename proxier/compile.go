package proxier

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// Config holds what Compile needs besides the snapshot. Only the prefixes of
// the compiled family are used.
type Config struct {
	Family m.Family
	// ClusterCIDRs: traffic to a ClusterIP from outside these is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// NodePortAddresses limits NodePorts to local addresses in these
	// prefixes; empty means every local address but loopback.
	NodePortAddresses []netip.Prefix
	// LocalhostNodePorts serves IPv4 NodePorts on 127.0.0.0/8 too, as
	// kube-proxy's iptables mode does (the daemon sets route_localnet).
	LocalhostNodePorts bool
	// ServiceCIDRs are the ranges ClusterIPs come from: traffic to an
	// address in them that no service has is dropped.
	ServiceCIDRs []netip.Prefix
}

func (c Config) inFamily(p netip.Prefix) bool { return p.Addr().Is4() == (c.Family == m.IPv4) }
func (c Config) addrInFamily(a netip.Addr) bool {
	return a.IsValid() && a.Is4() == (c.Family == m.IPv4)
}

// rejectVerdict answers traffic to a service port without endpoints.
var rejectVerdict = &m.Verdict{Kind: m.Goto, Chain: chainReject}

var (
	vipKey      = []m.Field{m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport}
	nodePortKey = []m.Field{m.FieldL4Proto, m.FieldTHDport}
)

// Compile builds the ruleset of one family from a snapshot. It is pure and
// deterministic: the same input gives the same ruleset, sorted.
func Compile(snap *k8s.Snapshot, cfg Config) *m.Ruleset {
	c := newCompiler(cfg, snap.Node)
	for i := range snap.Services {
		c.addService(&snap.Services[i])
	}
	return c.ruleset()
}

type compiler struct {
	cfg     Config
	node    k8s.Node
	addrT   m.DataType
	vipT    []m.DataType
	targetT []m.DataType
	npT     []m.DataType

	serviceIPs, serviceNodePorts       []m.Element
	noEndpointIPs, noEndpointNodePorts []m.Element
	hairpin                            map[netip.Addr]bool
	slots, nodePortSlots               [][]m.Element // per slot index
	clusterN, externalN, nodePortN     map[int]bool  // endpoint counts in use
	clusterIPs                         map[netip.Addr]bool
	firewallIPs                        []m.Element
	ownSets                            []*m.Set   // affinity sets
	ownChains                          []*m.Chain // per-service chains, in service order
}

func newCompiler(cfg Config, node k8s.Node) *compiler {
	addrT := m.TypeIPv4Addr
	if cfg.Family == m.IPv6 {
		addrT = m.TypeIPv6Addr
	}
	return &compiler{
		cfg:        cfg,
		node:       node,
		clusterIPs: map[netip.Addr]bool{},
		addrT:      addrT,
		vipT:       []m.DataType{addrT, m.TypeInetProto, m.TypeInetService},
		targetT:    []m.DataType{addrT, m.TypeInetService},
		npT:        []m.DataType{m.TypeInetProto, m.TypeInetService},
		hairpin:    map[netip.Addr]bool{},
		clusterN:   map[int]bool{},
		externalN:  map[int]bool{},
		nodePortN:  map[int]bool{},
	}
}

func (c *compiler) addService(sp *k8s.ServicePort) {
	// Like kube-proxy, a family's table only serves services with a
	// ClusterIP of that family: an external or load balancer address of the
	// other family is not the service's business there.
	if !c.hasFamilyAddress(sp) {
		return
	}
	choice := chooseEndpoints(sp, &c.node, func(e k8s.Endpoint) bool { return c.cfg.addrInFamily(e.Addr) })
	internal := choice.internal(sp)
	for _, e := range slices.Concat(choice.cluster, choice.local) {
		c.hairpin[e.Addr] = true
	}
	proto := m.N(uint32(sp.Name.Protocol.Number()))
	port := m.N(uint32(sp.Port))
	comment := sp.Name.String()
	// Affinity and eTP=Local need chains of their own; everything else
	// shares the dispatch chains and slot maps.
	var own *serviceChains
	if sp.AffinityTimeout > 0 || sp.ExternalPolicyLocal {
		own = c.serviceChains(sp, choice)
	}
	noEndpoints := func(set *[]m.Element, key []m.Value, drop bool) {
		v := rejectVerdict
		if drop {
			v = &m.Verdict{Kind: m.Drop}
		}
		*set = append(*set, m.Element{Key: key, Comment: comment, Verdict: v})
	}
	dispatch := func(set *[]m.Element, key []m.Value, chain string) {
		*set = append(*set, m.Element{Key: key, Comment: comment, Verdict: &m.Verdict{Kind: m.Goto, Chain: chain}})
	}
	fillSlots := func(slots *[][]m.Element, key []m.Value, eps []k8s.Endpoint) {
		for i, e := range eps {
			c.slot(slots, i, m.Element{Key: key, Data: []m.Value{m.A(e.Addr), m.N(uint32(e.Port))}})
		}
	}

	for _, ip := range sp.ClusterIPs {
		if !c.cfg.addrInFamily(ip) {
			continue
		}
		c.clusterIPs[ip] = true
		key := []m.Value{m.A(ip), proto, port}
		switch {
		case len(internal) == 0:
			// iTP=Local without local endpoints drops, like kube-proxy;
			// no endpoints at all rejects.
			noEndpoints(&c.noEndpointIPs, key, sp.InternalPolicyLocal && len(choice.cluster) > 0)
		case sp.AffinityTimeout > 0:
			dispatch(&c.serviceIPs, key, own.internal)
		default:
			dispatch(&c.serviceIPs, key, clusterIPChain(len(internal)))
			c.clusterN[len(internal)] = true
			fillSlots(&c.slots, key, internal)
		}
	}
	// External traffic: eTP=Local keeps it on this node (own chains);
	// otherwise it shares the chains that masquerade everything.
	external := func(key []m.Value, dispatchSet, noEndpointSet *[]m.Element, slots *[][]m.Element, shared func(int) string, counts map[int]bool) {
		switch {
		case len(choice.cluster) == 0:
			noEndpoints(noEndpointSet, key, false)
		case own != nil:
			dispatch(dispatchSet, key, own.external)
		default:
			dispatch(dispatchSet, key, shared(len(choice.cluster)))
			counts[len(choice.cluster)] = true
			fillSlots(slots, key, choice.cluster)
		}
	}
	for _, ip := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if !c.cfg.addrInFamily(ip) {
			continue
		}
		key := []m.Value{m.A(ip), proto, port}
		external(key, &c.serviceIPs, &c.noEndpointIPs, &c.slots, externalChain, c.externalN)
		// Like kube-proxy, only ranges of the compiled family filter: a
		// family without any leaves its load balancer addresses open.
		if slices.ContainsFunc(sp.LoadBalancerSourceRanges, c.cfg.inFamily) && slices.Contains(sp.LoadBalancerIPs, ip) {
			c.firewall(sp, key)
		}
	}
	if sp.NodePort == 0 {
		return
	}
	key := []m.Value{proto, m.N(uint32(sp.NodePort))}
	external(key, &c.serviceNodePorts, &c.noEndpointNodePorts, &c.nodePortSlots, nodePortChain, c.nodePortN)
}

// hasFamilyAddress tells whether the service has a ClusterIP of the compiled
// family: a single-stack service gets rules, NodePorts included, in its own
// family only.
func (c *compiler) hasFamilyAddress(sp *k8s.ServicePort) bool {
	return slices.ContainsFunc(sp.ClusterIPs, c.cfg.addrInFamily)
}

func (c *compiler) slot(slots *[][]m.Element, i int, e m.Element) {
	for len(*slots) <= i {
		*slots = append(*slots, nil)
	}
	(*slots)[i] = append((*slots)[i], e)
}

func (c *compiler) ruleset() *m.Ruleset {
	rs := &m.Ruleset{Family: c.cfg.Family, Table: TableName}
	rs.Sets = c.sets()
	rs.Chains = append(c.baseChains(), c.fixedChains()...)
	rs.Chains = append(rs.Chains, c.dispatchChains()...)
	rs.Chains = append(rs.Chains, c.ownChains...)
	return rs
}

func (c *compiler) sets() []*m.Set {
	verdict := []m.DataType{m.TypeVerdict}
	hairpinT := []m.DataType{c.addrT, c.addrT}
	var hairpin, clusterIPs []m.Element
	for a := range c.hairpin {
		hairpin = append(hairpin, m.Element{Key: []m.Value{m.A(a), m.A(a)}})
	}
	for a := range c.clusterIPs {
		clusterIPs = append(clusterIPs, m.Element{Key: []m.Value{m.A(a)}})
	}
	sets := []*m.Set{
		{Name: mapServiceIPs, Key: c.vipT, Data: verdict, Elements: c.serviceIPs},
		{Name: mapServiceNodePorts, Key: c.npT, Data: verdict, Elements: c.serviceNodePorts},
		{Name: mapNoEndpointServices, Key: c.vipT, Data: verdict, Elements: c.noEndpointIPs},
		{Name: mapNoEndpointNodePorts, Key: c.npT, Data: verdict, Elements: c.noEndpointNodePorts},
		{Name: setHairpin, Key: hairpinT, Elements: hairpin},
		{Name: mapFirewallIPs, Key: c.vipT, Data: verdict, Elements: c.firewallIPs},
		{Name: setClusterIPs, Key: []m.DataType{c.addrT}, Elements: clusterIPs},
	}
	for i, els := range c.slots {
		sets = append(sets, &m.Set{Name: endpointSlotMap(i), Key: c.vipT, Data: c.targetT, Elements: els})
	}
	for i, els := range c.nodePortSlots {
		sets = append(sets, &m.Set{Name: nodePortSlotMap(i), Key: c.npT, Data: c.targetT, Elements: els})
	}
	sets = append(sets, c.ownSets...)
	for _, s := range sets {
		s.Elements = m.SortedElements(s)
	}
	return sets
}

func jump(chain string) m.Rule {
	return m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Jump, Chain: chain}}}
}

func (c *compiler) baseChains() []*m.Chain {
	base := func(name string, t m.ChainType, h m.Hook, prio int32, rules ...m.Rule) *m.Chain {
		return &m.Chain{Name: name, Base: &m.BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules}
	}
	dropMarked := m.Rule{Exprs: []m.Expr{m.MatchMark{Mask: markDrop, IsSet: true}, m.Verdict{Kind: m.Drop}}}
	dropInvalid := m.Rule{Exprs: []m.Expr{m.MatchCtStateInvalid{}, m.Verdict{Kind: m.Drop}}}
	firewall := m.Rule{Exprs: []m.Expr{m.VerdictMap{Key: vipKey, Map: mapFirewallIPs}}}
	return []*m.Chain{
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
		base(chainFilterPrerouting, m.TypeFilter, m.HookPrerouting, -90, jump(chainEndpointsCheck)),
		base(chainFilterInput, m.TypeFilter, m.HookInput, 0, dropMarked),
		base(chainFilterForward, m.TypeFilter, m.HookForward, 0, dropInvalid, dropMarked),
		base(chainFilterOutput, m.TypeFilter, m.HookOutput, 0, dropMarked, jump(chainEndpointsCheck)),
	}
}

func (c *compiler) nodePortMatch() [][]m.Expr {
	if len(c.cfg.NodePortAddresses) == 0 {
		if c.cfg.LocalhostNodePorts && c.cfg.Family == m.IPv4 {
			return [][]m.Expr{{m.MatchFibDaddrLocal{}}}
		}
		loopback := netip.MustParsePrefix("127.0.0.0/8")
		if c.cfg.Family == m.IPv6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		return [][]m.Expr{{m.MatchPrefix{Field: m.FieldDaddr, Prefix: loopback, Negate: true}, m.MatchFibDaddrLocal{}}}
	}
	var out [][]m.Expr
	for _, p := range c.cfg.NodePortAddresses {
		if c.cfg.inFamily(p) {
			out = append(out, []m.Expr{m.MatchFibDaddrLocal{}, m.MatchPrefix{Field: m.FieldDaddr, Prefix: p}})
		}
	}
	return out
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
		{Name: chainMarkForMasquerade, Rules: []m.Rule{{Exprs: []m.Expr{m.MarkOr{Bits: markMasquerade}}}}},
		{Name: chainMasquerading, Rules: []m.Rule{
			// Hairpin: an endpoint that reached itself through a service must
			// see the reply come from elsewhere, or it would answer itself.
			{Exprs: []m.Expr{m.MatchCtStatusDNAT{}, m.MatchSet{Key: []m.Field{m.FieldSaddr, m.FieldDaddr}, Set: setHairpin},
				m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}},
			{Exprs: []m.Expr{m.MatchMark{Mask: markMasquerade}, m.Verdict{Kind: m.Return}}},
			// Clear the bit so a packet that is routed again is not re-marked.
			{Exprs: []m.Expr{m.MarkXor{Bits: markMasquerade}}},
			{Exprs: []m.Expr{m.Masquerade{FullyRandom: true}}},
		}},
		check,
		{Name: chainReject, Rules: []m.Rule{
			{Exprs: []m.Expr{m.Reject{TCPReset: true}}},
			{Exprs: []m.Expr{m.Reject{}}},
		}},
	}
}

// dispatchChains builds the shared per-endpoint-count chains and the per-slot
// DNAT chains.
func (c *compiler) dispatchChains() []*m.Chain {
	var chains []*m.Chain
	pick := func(n int, slotChain func(int) string) m.Expr {
		if n == 1 {
			return m.Verdict{Kind: m.Goto, Chain: slotChain(0)}
		}
		targets := make([]string, n)
		for i := range targets {
			targets[i] = slotChain(i)
		}
		return m.NumgenGoto{Chains: targets}
	}
	markAll := jump(chainMarkForMasquerade)
	for _, n := range sortedCounts(c.clusterN) {
		ch := &m.Chain{Name: clusterIPChain(n)}
		if r, ok := c.clusterMasquerade(); ok {
			ch.Rules = append(ch.Rules, r)
		}
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{pick(n, endpointSlotChain)}})
		chains = append(chains, ch)
	}
	for _, n := range sortedCounts(c.externalN) {
		chains = append(chains, &m.Chain{Name: externalChain(n), Rules: []m.Rule{markAll,
			{Exprs: []m.Expr{pick(n, endpointSlotChain)}}}})
	}
	for _, n := range sortedCounts(c.nodePortN) {
		chains = append(chains, &m.Chain{Name: nodePortChain(n), Rules: []m.Rule{markAll,
			{Exprs: []m.Expr{pick(n, nodePortSlotChain)}}}})
	}
	for i := range c.slots {
		chains = append(chains, &m.Chain{Name: endpointSlotChain(i), Rules: []m.Rule{
			{Exprs: []m.Expr{m.DNATMap{Key: vipKey, Map: endpointSlotMap(i)}}}}})
	}
	for i := range c.nodePortSlots {
		chains = append(chains, &m.Chain{Name: nodePortSlotChain(i), Rules: []m.Rule{
			{Exprs: []m.Expr{m.DNATMap{Key: nodePortKey, Map: nodePortSlotMap(i)}}}}})
	}
	return chains
}

// clusterMasquerade is the rule that marks ClusterIP traffic for masquerade:
// everything with --masquerade-all, else what comes from outside the cluster.
func (c *compiler) clusterMasquerade() (m.Rule, bool) {
	if c.cfg.MasqueradeAll {
		return jump(chainMarkForMasquerade), true
	}
	for _, p := range c.cfg.ClusterCIDRs {
		if c.cfg.inFamily(p) {
			return m.Rule{Exprs: []m.Expr{m.MatchPrefix{Field: m.FieldSaddr, Prefix: p.Masked(), Negate: true},
				m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}}, true
		}
	}
	return m.Rule{}, false
}

func sortedCounts(set map[int]bool) []int {
	var out []int
	for n, used := range set {
		if used {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
