// Compile's entry point: its configuration, the compiler and the declarations of the shared sets.

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
	// prefixes. A family with none of them (or with 0.0.0.0/0, ::/0) serves
	// NodePorts on every local address but loopback, as kube-proxy does.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary serves NodePorts only on the node's primary address
	// of each family (kube-proxy's "primary", its nftables mode's default):
	// BindAddress when it is of the family, else the Node's first address
	// of the family. A family without one serves every local address.
	NodePortPrimary bool
	// BindAddress is kube-proxy's bindAddress: when not unspecified, the
	// primary address of its family.
	BindAddress netip.Addr
	// LocalhostNodePorts serves IPv4 NodePorts on 127.0.0.0/8 too, as
	// kube-proxy's iptables mode does (the daemon sets route_localnet).
	LocalhostNodePorts bool
	// RouteLocalnetOwned records in the localnet guard's comment that
	// nftproxy turned route_localnet on, so that cleanup turns it off again
	// and a restart knows it still owns it (RouteLocalnetOwned).
	RouteLocalnetOwned bool
	// ServiceCIDRs are the ranges ClusterIPs come from: traffic to an
	// address in them that no service has is dropped.
	ServiceCIDRs []netip.Prefix
	// MasqueradeBit is the bit of the packet mark that asks for masquerade
	// (kube-proxy's masqueradeBit); 0 means 14, kube-proxy's default.
	MasqueradeBit int
	// DetectLocal says how traffic from this cluster's pods is told apart:
	// it is not masqueraded on its way to a ClusterIP.
	DetectLocal DetectLocal
	// DropInvalid drops forwarded packets conntrack calls invalid, as
	// kube-proxy's iptables mode does unless nf_conntrack_tcp_be_liberal is set.
	DropInvalid bool
}

// Detect-local modes, kube-proxy's detectLocalMode values.
const (
	LocalClusterCIDR         = "ClusterCIDR"         // source in ClusterCIDRs (the default)
	LocalNodeCIDR            = "NodeCIDR"            // source in the Node's spec.podCIDRs
	LocalBridgeInterface     = "BridgeInterface"     // arriving on the pod bridge
	LocalInterfaceNamePrefix = "InterfaceNamePrefix" // arriving on an interface with the pods' prefix
	LocalNone                = "None"                // no traffic is local: none is masqueraded for it
)

// DetectLocal is kube-proxy's detectLocalMode and detectLocal settings.
type DetectLocal struct {
	Mode string // one of the Local* modes; empty means ClusterCIDR
	// BridgeInterface or InterfaceNamePrefix, for those modes.
	Interface string
}

func (c Config) inFamily(p netip.Prefix) bool { return p.Addr().Is4() == (c.Family == m.IPv4) }
func (c Config) addrInFamily(a netip.Addr) bool {
	return a.IsValid() && a.Is4() == (c.Family == m.IPv4)
}

var (
	vipKey = []m.Field{m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport}
	// firewallKey is a load balancer address key and the client's address.
	firewallKey = []m.Field{m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport, m.FieldSaddr}
	clientKey   = []m.Field{m.FieldSaddr, m.FieldDaddr, m.FieldL4Proto, m.FieldTHDport} // the affinity map's
	// A connection's client key and endpoint after DNAT, from conntrack.
	connKey     = []m.Field{m.FieldSaddr, m.FieldCtOriginalDaddr, m.FieldL4Proto, m.FieldCtOriginalProtoDst}
	connTarget  = []m.Field{m.FieldCtReplySaddr, m.FieldCtReplyProtoSrc}
	nodePortKey = []m.Field{m.FieldL4Proto, m.FieldTHDport}
	targetKey   = []m.Field{m.FieldDaddr, m.FieldTHDport} // what a DNAT target is
)

// typeofSlotModulus is the modulus the endpoint maps' typeof declarations
// name: there it only gives the slot its type (a 32-bit integer), so it
// reads as "any slot".
const typeofSlotModulus = 65536

// Compile builds the ruleset of one family from a snapshot. It is pure and
// deterministic: the same input gives the same ruleset, sorted, every
// service port's endpoints in slots in their sorted order.
func Compile(snap *k8s.Snapshot, cfg Config) *m.Ruleset {
	return compileWithSlots(snap, cfg, nil)
}

// compileWithSlots is Compile with the endpoints placed in slots after a
// previous assignment (see nextSlots); nil gives Compile's ruleset.
func compileWithSlots(snap *k8s.Snapshot, cfg Config, prev Slots) *m.Ruleset {
	c := newCompiler(cfg, snap)
	c.slots = prev
	return m.Materialized(c.assemble(snap))
}

// compiler holds what every piece of one family's ruleset depends on
// besides its service port: the configuration, the node and the
// declarations of the shared sets.
type compiler struct {
	cfg          Config
	node         k8s.Node
	serviceCIDRs []netip.Prefix // the snapshot's, already in cfg
	addrT        m.DataType
	vipT         []m.DataType
	targetT      []m.DataType
	npT          []m.DataType

	// Declarations of the shared sets, without elements.
	serviceIPs, serviceNodePorts         *m.Set
	noEndpointIPs, noEndpointNodePorts   *m.Set
	hairpin, clusterIPs                  *m.Set
	firewallIPs, firewallAllow           *m.Set
	endpoints, nodePortEndpoints         *m.Set
	wideEndpoints, wideNodePortEndpoints *m.Set
	affinity                             *m.Set
	affinityServices, affinityNodePorts  *m.Set
	// slots is the assignment the pieces' slot orders follow.
	slots Slots
	// here keeps the endpoints that may be on this node (mayBeHere).
	here func(*k8s.Endpoint) bool

	// Verdicts are immutable: elements going to the same chain share one.
	gotos map[string]*m.Verdict
}

// gotoVerdict returns the shared verdict "goto chain".
func (c *compiler) gotoVerdict(chain string) *m.Verdict {
	v, ok := c.gotos[chain]
	if !ok {
		v = &m.Verdict{Kind: m.Goto, Chain: chain}
		c.gotos[chain] = v
	}
	return v
}

// newCompiler prepares the compilation of snap's service ports: the ranges
// of the snapshot's ServiceCIDR objects join the configured ones.
func newCompiler(cfg Config, snap *k8s.Snapshot) *compiler {
	cfg.ServiceCIDRs = withServiceCIDRs(cfg.ServiceCIDRs, snap.ServiceCIDRs)
	addrT := m.TypeIPv4Addr
	if cfg.Family == m.IPv6 {
		addrT = m.TypeIPv6Addr
	}
	c := &compiler{
		cfg:          cfg,
		node:         snap.Node,
		serviceCIDRs: snap.ServiceCIDRs,
		addrT:        addrT,
		vipT:         []m.DataType{addrT, m.TypeInetProto, m.TypeInetService},
		targetT:      []m.DataType{addrT, m.TypeInetService},
		npT:          []m.DataType{m.TypeInetProto, m.TypeInetService},
		gotos:        map[string]*m.Verdict{},
	}
	c.here = mayBeHere(&c.node)
	verdict := []m.DataType{m.TypeVerdict}
	c.serviceIPs = &m.Set{Name: mapServiceIPs, Key: c.vipT, Data: verdict}
	c.serviceNodePorts = &m.Set{Name: mapServiceNodePorts, Key: c.npT, Data: verdict}
	c.noEndpointIPs = &m.Set{Name: mapNoEndpointServices, Key: c.vipT, Data: verdict}
	c.noEndpointNodePorts = &m.Set{Name: mapNoEndpointNodePorts, Key: c.npT, Data: verdict}
	c.hairpin = &m.Set{Name: setHairpin, Key: []m.DataType{addrT, addrT}}
	c.firewallIPs = &m.Set{Name: setFirewallIPs, Key: c.vipT}
	c.firewallAllow = &m.Set{Name: setFirewallAllow, Key: append(slices.Clone(c.vipT), addrT), Interval: true}
	c.clusterIPs = &m.Set{Name: setClusterIPs, Key: []m.DataType{addrT}}
	c.endpoints = &m.Set{Name: mapEndpoints, Key: append(slices.Clone(c.vipT), m.TypeInteger), Data: c.targetT,
		Typeof: &m.Typeof{Key: vipKey, KeyNumgen: typeofSlotModulus, Data: targetKey}}
	c.nodePortEndpoints = &m.Set{Name: mapNodePortEndpoints, Key: append(slices.Clone(c.npT), m.TypeInteger), Data: c.targetT,
		Typeof: &m.Typeof{Key: nodePortKey, KeyNumgen: typeofSlotModulus, Data: targetKey}}
	c.wideEndpoints, c.wideNodePortEndpoints = renamed(c.endpoints, mapWideEndpoints), renamed(c.nodePortEndpoints, mapWideNodePortEndpoints)
	// The map's own timeout is only its declaration's: every element gets
	// its service's from the rule that adds it.
	c.affinity = &m.Set{Name: mapAffinity, Key: []m.DataType{addrT, addrT, m.TypeInetProto, m.TypeInetService}, Data: c.targetT,
		Typeof: &m.Typeof{Key: clientKey, Data: targetKey}, Timeout: affinityMapTimeout, Size: affinityMapSize}
	c.affinityServices = &m.Set{Name: mapAffinityServices, Key: c.vipT, Data: verdict}
	c.affinityNodePorts = &m.Set{Name: mapAffinityNodePorts, Key: c.npT, Data: verdict}
	return c
}

// withServiceCIDRs adds the snapshot's ranges to the configured ones, each
// once.
func withServiceCIDRs(configured, fromCluster []netip.Prefix) []netip.Prefix {
	out := slices.Clone(configured)
	for _, p := range fromCluster {
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Masked() == p.Masked() }) {
			out = append(out, p)
		}
	}
	return out
}

// renamed is a copy of the declaration decl under another name.
func renamed(decl *m.Set, name string) *m.Set {
	s := *decl
	s.Name = name
	return &s
}

// fixedSets are the declarations of the sets every ruleset has, in the
// order the ruleset lists them.
func (c *compiler) fixedSets() []*m.Set {
	return []*m.Set{c.serviceIPs, c.serviceNodePorts, c.noEndpointIPs, c.noEndpointNodePorts,
		c.hairpin, c.firewallIPs, c.firewallAllow, c.clusterIPs, c.endpoints, c.nodePortEndpoints,
		c.wideEndpoints, c.wideNodePortEndpoints,
		c.affinity, c.affinityServices, c.affinityNodePorts}
}

func jump(chain string) m.Rule {
	return m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Jump, Chain: chain}}}
}
