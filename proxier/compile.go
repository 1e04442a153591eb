package proxier

import (
	"cmp"
	"fmt"
	"maps"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"time"

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

// rejectVerdict answers traffic to a service port without endpoints.
var rejectVerdict = &m.Verdict{Kind: m.Goto, Chain: chainReject}

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

// affinityMapTimeout is the affinity map's declared timeout, kube-proxy's
// default affinity; elements carry their service's.
const affinityMapTimeout = 3 * time.Hour

// affinityMapSize bounds the clients the affinity map remembers on a node,
// for every service: 16 times what each per-endpoint set of kube-proxy
// holds (nft's default, 65535); at worst (a flood of new sources) on the
// order of 100-200 MB of kernel memory (an estimate: a hash element of
// ~100-200 bytes each). A client the full map can't take is picked at
// random, without affinity.
const affinityMapSize = 1 << 20

// affinityProtocols are the protocols whose connections affinity
// remembers: nft types `ct original proto-dst` only after a protocol match,
// so each has its rule.
var affinityProtocols = []uint8{6, 17, 132}

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

// piece is what one service port adds to a family's ruleset. Compile
// assembles the pieces of every service port; the incremental compiler swaps
// the piece of a changed one.
type piece struct {
	elements   []keyedElement // of the shared sets and maps, but the endpoint maps
	runs       []slotRun      // the endpoint maps' elements
	hairpin    []netip.Addr   // endpoints that may reach themselves
	clusterIPs []netip.Addr
	uses       []sharedObj // shared chains it needs
	slotOrders []slotOrder // the order of each endpoint list in the slots
	affinity   bool        // it fills the affinity map
}

// slotRun stands for the elements of one service port key in an endpoint
// map, key . i : eps[i] for every slot i. Kept unexpanded, two versions of a
// wide service compare slot by slot without building thousands of elements.
type slotRun struct {
	set *m.Set
	key []m.Value
	eps slotList
	// offset is the first slot's number: 0, or localSlotOffset for the
	// local endpoints of an eTP=Local service port's external key.
	offset uint32
}

// localSlotOffset is where the slots of an eTP=Local service port's local
// endpoints start, under the same key as its cluster-wide slots: far enough
// that the cluster-wide ones never reach it, so neither list moves when the
// other changes length.
const localSlotOffset = 65536

// element is slot i's element; keys and data are taken from the fronts of
// the buffers given, which must have room.
func (r *slotRun) element(i int, keys, data []m.Value) m.Element {
	k := append(append(keys[:0:len(r.key)+1], r.key...), m.N(r.offset+uint32(i)))
	e := r.eps.at(i)
	d := append(data[:0:2], m.A(e.Addr), m.N(uint32(e.Port)))
	return m.Element{Key: k, Data: d}
}

// appendElements appends every slot's element, with one allocation for the
// keys and one for the targets.
func (r slotRun) appendElements(dst []m.Element) []m.Element {
	k := len(r.key) + 1
	n := r.eps.len()
	keys := make([]m.Value, k*n)
	data := make([]m.Value, 2*n)
	for i := range n {
		dst = append(dst, r.element(i, keys[k*i:], data[2*i:]))
	}
	return dst
}

// keyedElement is an element of a set shared by all services; set is the
// set's declaration, without elements.
type keyedElement struct {
	set *m.Set
	el  m.Element
}

// sharedObj names a chain service ports share: the dispatch chain of one
// endpoint count for one kind of traffic.
type sharedObj struct {
	kind     sharedKind
	n        int  // endpoint count; the timeout in seconds for affinityUpdate
	local    int  // local endpoint count, for the eTP=Local kinds
	affinity bool // a client's remembered endpoint first (session affinity)
}

// sharedKind orders the shared objects as the ruleset lists them.
type sharedKind uint8

const (
	clusterDispatch sharedKind = iota
	externalDispatch
	nodePortDispatch
	externalLocalDispatch // eTP=Local: external traffic from outside to local endpoints
	nodePortLocalDispatch
	affinityUpdate // remembers a new connection's endpoint for n seconds
)

func compareShared(a, b sharedObj) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), compareBool(a.affinity, b.affinity), cmp.Compare(a.n, b.n), cmp.Compare(a.local, b.local))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case b:
		return -1
	}
	return 1
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
	serviceIPs, serviceNodePorts        *m.Set
	noEndpointIPs, noEndpointNodePorts  *m.Set
	hairpin, clusterIPs                 *m.Set
	firewallIPs, firewallAllow          *m.Set
	endpoints, nodePortEndpoints        *m.Set
	affinity                            *m.Set
	affinityServices, affinityNodePorts *m.Set
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

// fixedSets are the declarations of the sets every ruleset has, in the
// order the ruleset lists them.
func (c *compiler) fixedSets() []*m.Set {
	return []*m.Set{c.serviceIPs, c.serviceNodePorts, c.noEndpointIPs, c.noEndpointNodePorts,
		c.hairpin, c.firewallIPs, c.firewallAllow, c.clusterIPs, c.endpoints, c.nodePortEndpoints,
		c.affinity, c.affinityServices, c.affinityNodePorts}
}

// piece compiles one service port: its ClusterIPs, its external
// addresses (external IPs and load balancer IPs) and its node port.
func (c *compiler) piece(sp *k8s.ServicePort) *piece {
	// Like kube-proxy, a family's table only serves services with a
	// ClusterIP of that family: an external or load balancer address of the
	// other family is not the service's business there.
	if !c.hasFamilyAddress(sp) {
		return &piece{}
	}
	b := c.newPieceBuilder(sp)
	for _, ip := range sp.ClusterIPs {
		if c.cfg.addrInFamily(ip) {
			b.clusterIP(ip)
		}
	}
	for _, ip := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if c.cfg.addrInFamily(ip) {
			b.externalIP(ip)
		}
	}
	if sp.NodePort != 0 {
		b.nodePort()
	}
	return b.p
}

// pieceBuilder compiles the piece of one service port, one address at a
// time.
type pieceBuilder struct {
	c       *compiler
	sp      *k8s.ServicePort
	p       *piece
	choice  endpointChoice
	proto   m.Value
	comment string
}

// newPieceBuilder returns the builder by value: it stays on the caller's
// stack (one allocation less per service port in a full sync).
func (c *compiler) newPieceBuilder(sp *k8s.ServicePort) pieceBuilder {
	b := pieceBuilder{c: c, sp: sp, p: &piece{},
		choice:  chooseEndpoints(sp, &c.node, func(e *k8s.Endpoint) bool { return c.cfg.addrInFamily(e.Addr) }),
		proto:   m.N(uint32(sp.Name.Protocol.Number())),
		comment: sp.Name.String(),
	}
	// Room for the elements at once: a key per address and the node port.
	keys := len(sp.ClusterIPs) + len(sp.ExternalIPs) + len(sp.LoadBalancerIPs)
	if sp.NodePort != 0 {
		keys++
	}
	b.p.elements = make([]keyedElement, 0, keys)
	b.p.uses = make([]sharedObj, 0, keys)
	b.p.hairpin = hairpinAddrs(b.choice, c.here)
	return b
}

// clusterIP dispatches traffic to one ClusterIP.
func (b *pieceBuilder) clusterIP(ip netip.Addr) {
	if !slices.Contains(b.p.clusterIPs, ip) {
		b.p.clusterIPs = append(b.p.clusterIPs, ip)
	}
	key := []m.Value{m.A(ip), b.proto, m.N(uint32(b.sp.Port))}
	internal := b.choice.internal(b.sp)
	switch {
	case len(internal) == 0:
		// iTP=Local without local endpoints drops, like kube-proxy;
		// no endpoints at all rejects.
		b.noEndpoints(b.c.noEndpointIPs, key, b.sp.InternalPolicyLocal && len(b.choice.cluster) > 0)
	default:
		b.shared(b.c.serviceIPs, key, clusterDispatch, b.c.endpoints, b.sp.InternalPolicyLocal, internal)
	}
}

// externalIP dispatches traffic to one external or load balancer address,
// behind the load balancer's source ranges when it has some.
func (b *pieceBuilder) externalIP(ip netip.Addr) {
	key := []m.Value{m.A(ip), b.proto, m.N(uint32(b.sp.Port))}
	b.external(key, b.c.serviceIPs, b.c.noEndpointIPs, externalDispatch, externalLocalDispatch, b.c.endpoints)
	// Like kube-proxy, only ranges of the compiled family filter: a
	// family without any leaves its load balancer addresses open.
	if slices.ContainsFunc(b.sp.LoadBalancerSourceRanges, b.c.cfg.inFamily) && slices.Contains(b.sp.LoadBalancerIPs, ip) {
		b.c.firewall(b.p, b.sp, key)
	}
}

// nodePort dispatches traffic to the node port.
func (b *pieceBuilder) nodePort() {
	key := []m.Value{b.proto, m.N(uint32(b.sp.NodePort))}
	b.external(key, b.c.serviceNodePorts, b.c.noEndpointNodePorts, nodePortDispatch, nodePortLocalDispatch, b.c.nodePortEndpoints)
}

// external dispatches external traffic: eTP=Local keeps traffic from
// outside on this node; otherwise it shares the chains that masquerade
// everything.
func (b *pieceBuilder) external(key []m.Value, dispatchSet, noEndpointSet *m.Set, kind, localKind sharedKind, targets *m.Set) {
	switch {
	case len(b.choice.cluster) == 0:
		b.noEndpoints(noEndpointSet, key, false)
	case b.sp.ExternalPolicyLocal:
		b.sharedLocal(dispatchSet, key, localKind, targets)
	default:
		b.shared(dispatchSet, key, kind, targets, false, b.choice.cluster)
	}
}

// sharedLocal dispatches eTP=Local traffic through the chain for its
// cluster-wide and local endpoint counts; the local endpoints take the
// slots from localSlotOffset under the same key.
func (b *pieceBuilder) sharedLocal(set *m.Set, key []m.Value, kind sharedKind, targets *m.Set) {
	cluster := b.c.slotsOf(b.p, slotsKey{b.sp.Name, false}, b.choice.cluster)
	local := b.c.slotsOf(b.p, slotsKey{b.sp.Name, true}, b.choice.local)
	obj := sharedObj{kind: kind, n: cluster.len(), local: local.len(), affinity: b.sp.AffinityTimeout > 0}
	b.dispatch(set, key, b.c.sharedChainName(obj))
	b.p.uses = append(b.p.uses, obj)
	b.remember(set, key)
	b.p.runs = append(b.p.runs, slotRun{set: targets, key: key, eps: cluster})
	if local.len() > 0 {
		b.p.runs = append(b.p.runs, slotRun{set: targets, key: key, eps: local, offset: localSlotOffset})
	}
}

// noEndpoints refuses traffic to key: rejects it, or drops it.
func (b *pieceBuilder) noEndpoints(set *m.Set, key []m.Value, drop bool) {
	v := rejectVerdict
	if drop {
		v = &m.Verdict{Kind: m.Drop}
	}
	b.p.elements = append(b.p.elements, keyedElement{set, m.Element{Key: key, Comment: b.comment, Verdict: v}})
}

// dispatch sends traffic to key to chain.
func (b *pieceBuilder) dispatch(set *m.Set, key []m.Value, chain string) {
	b.p.elements = append(b.p.elements, keyedElement{set, m.Element{Key: key, Comment: b.comment, Verdict: b.c.gotoVerdict(chain)}})
}

// shared dispatches through the chain of kind for len(eps) endpoints and
// puts endpoint i into slot i of the map targets.
func (b *pieceBuilder) shared(set *m.Set, key []m.Value, kind sharedKind, targets *m.Set, local bool, eps []k8s.Endpoint) {
	order := b.c.slotsOf(b.p, slotsKey{b.sp.Name, local}, eps)
	obj := sharedObj{kind: kind, n: order.len(), affinity: b.sp.AffinityTimeout > 0}
	b.dispatch(set, key, b.c.sharedChainName(obj))
	b.p.uses = append(b.p.uses, obj)
	b.p.runs = append(b.p.runs, slotRun{set: targets, key: key, eps: order})
	b.remember(set, key)
}

// remember makes the connections to key (of the dispatch map set) fill
// the affinity map, with the service port's timeout, when it has affinity.
func (b *pieceBuilder) remember(set *m.Set, key []m.Value) {
	if b.sp.AffinityTimeout <= 0 {
		return
	}
	b.p.affinity = true
	entries := b.c.affinityServices
	if set == b.c.serviceNodePorts {
		entries = b.c.affinityNodePorts
	}
	obj := sharedObj{kind: affinityUpdate, n: int(b.sp.AffinityTimeout / time.Second)}
	b.dispatch(entries, key, b.c.sharedChainName(obj))
	b.p.uses = append(b.p.uses, obj)
}

// sortedByAddr tells whether endpoints are in address order, reading them in
// place (slices.IsSortedFunc would copy each large endpoint twice).
func sortedByAddr(eps []k8s.Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i].Addr.Less(eps[i-1].Addr) {
			return false
		}
	}
	return true
}

// hairpinAddrs lists the addresses of the endpoints a service port may
// send to that may be on this node, each once: a few are compared in place,
// a wide service's through a map or a merge walk. Only a packet from this
// node's own pods (or the node itself, for host-network endpoints) can be
// sent back to its source by these rules: a pod on another node reaches a
// service through its own node's proxy, and traffic from other nodes to
// external addresses and node ports is masqueraded anyway. So the hairpin
// set holds this node's endpoints, not the cluster's, and a change of a
// remote endpoint leaves it alone. here keeps the endpoints that may be on
// this node.
func hairpinAddrs(choice endpointChoice, here func(*k8s.Endpoint) bool) []netip.Addr {
	if len(choice.cluster)+len(choice.local) > 16 && sortedByAddr(choice.cluster) && sortedByAddr(choice.local) {
		return mergedAddrs(choice.cluster, choice.local, here)
	}
	out := make([]netip.Addr, 0, len(choice.local))
	var seen map[netip.Addr]bool
	if len(choice.cluster)+len(choice.local) > 16 {
		seen = make(map[netip.Addr]bool, len(choice.local))
	}
	for _, eps := range [][]k8s.Endpoint{choice.cluster, choice.local} {
		for i := range eps {
			e := &eps[i]
			switch {
			case !here(e):
				continue
			case seen != nil && seen[e.Addr], seen == nil && slices.Contains(out, e.Addr):
				continue
			case seen != nil:
				seen[e.Addr] = true
			}
			out = append(out, e.Addr)
		}
	}
	return out
}

// mayBeHere tells whether an endpoint may be on this node: it is, its node
// is not known, or this node's name is not known for sure (no Node object:
// then every endpoint counts, so that a name that does not match the
// cluster's costs no hairpin).
func mayBeHere(node *k8s.Node) func(*k8s.Endpoint) bool {
	if node.Name == "" || node.Fallback {
		return func(*k8s.Endpoint) bool { return true }
	}
	return func(e *k8s.Endpoint) bool { return e.NodeName == "" || e.NodeName == node.Name }
}

// mergedAddrs lists the addresses of two address-sorted endpoint lists that
// keep keeps, each once, sorted: a wide service's in one walk, without a map.
func mergedAddrs(a, b []k8s.Endpoint, keep func(*k8s.Endpoint) bool) []netip.Addr {
	// Counted first: a wide service's piece keeps the list, and on a node
	// that holds few of its endpoints room for all would be wasted.
	n := 0
	for _, eps := range [][]k8s.Endpoint{a, b} {
		for i := range eps {
			if keep(&eps[i]) {
				n++
			}
		}
	}
	out := make([]netip.Addr, 0, n)
	add := func(e *k8s.Endpoint) {
		if keep(e) && (len(out) == 0 || out[len(out)-1] != e.Addr) {
			out = append(out, e.Addr)
		}
	}
	for len(a) > 0 || len(b) > 0 {
		if c := walkOrder(len(a), len(b), func() int { return a[0].Addr.Compare(b[0].Addr) }); c <= 0 {
			add(&a[0])
			a = a[1:]
		} else {
			add(&b[0])
			b = b[1:]
		}
	}
	return out
}

// hasFamilyAddress tells whether the service has a ClusterIP of the compiled
// family: a single-stack service gets rules, NodePorts included, in its own
// family only.
func (c *compiler) hasFamilyAddress(sp *k8s.ServicePort) bool {
	return slices.ContainsFunc(sp.ClusterIPs, c.cfg.addrInFamily)
}

// assembly gathers a full ruleset out of the pieces of every service port,
// in service order, one piece at a time: what the ruleset is made of is
// kept, the rest of each piece is garbage at once, so that a full sync never
// holds every piece (at 100,000 services they were 73 MB of its peak). The
// endpoint maps, the hairpin and the cluster-IP sets get sources
// (m.Set.Source) that make their elements while a full apply encodes its
// batch: they are most of a table's elements, and held as a model they were
// most of the first sync's peak. m.Materialized holds them.
type assembly struct {
	c          *compiler
	elements   map[*m.Set][]m.Element
	runs       map[*m.Set][]slotRun
	hairpin    []netip.Addr
	clusterIPs []netip.Addr
	used       map[sharedObj]bool
}

// newAssembly starts a ruleset, its lists sized from the snapshot's hint
// so that they are allocated once.
func (c *compiler) newAssembly(hint sizeHint) *assembly {
	return &assembly{
		c:        c,
		elements: map[*m.Set][]m.Element{c.serviceIPs: make([]m.Element, 0, hint.ports)},
		// The endpoint maps always have a source, with or without runs.
		runs:       map[*m.Set][]slotRun{c.endpoints: make([]slotRun, 0, hint.ports), c.nodePortEndpoints: nil},
		hairpin:    make([]netip.Addr, 0, hint.endpoints),
		clusterIPs: make([]netip.Addr, 0, hint.clusterIPs),
		used:       map[sharedObj]bool{},
	}
}

// sizeHint is what the pieces of snap hold at most, summed: the service
// ports with an address of the family, their ClusterIPs and their
// endpoints of the family.
type sizeHint struct{ ports, clusterIPs, endpoints int }

func (c *compiler) sizeHint(snap *k8s.Snapshot) sizeHint {
	var h sizeHint
	for i := range snap.Services {
		sp := &snap.Services[i]
		if !c.hasFamilyAddress(sp) {
			continue
		}
		h.ports++
		for _, ip := range sp.ClusterIPs {
			if c.cfg.addrInFamily(ip) {
				h.clusterIPs++
			}
		}
		for j := range sp.Endpoints {
			if c.cfg.addrInFamily(sp.Endpoints[j].Addr) {
				h.endpoints++
			}
		}
	}
	return h
}

// add takes what the ruleset needs of one piece.
func (a *assembly) add(p *piece) {
	for _, ke := range p.elements {
		a.elements[ke.set] = append(a.elements[ke.set], ke.el)
	}
	for _, r := range p.runs {
		a.runs[r.set] = append(a.runs[r.set], r)
	}
	a.hairpin = append(a.hairpin, p.hairpin...)
	a.clusterIPs = append(a.clusterIPs, p.clusterIPs...)
	for _, o := range p.uses {
		a.used[o] = true
	}
}

// ruleset is the ruleset of the pieces added.
func (a *assembly) ruleset() *m.Ruleset {
	c := a.c
	sources := map[*m.Set]m.ElementSource{
		c.hairpin:    addrSource{addrs: sortedAddrs(a.hairpin), parts: 2},
		c.clusterIPs: addrSource{addrs: sortedAddrs(a.clusterIPs), parts: 1},
	}
	for set, rs := range a.runs {
		sources[set] = newRunSource(a.elements[set], rs)
	}
	objs := slices.SortedFunc(maps.Keys(a.used), compareShared)

	rs := &m.Ruleset{Family: c.cfg.Family, Table: TableName}
	withElements := func(decl *m.Set) *m.Set {
		s := *decl
		if src := sources[decl]; src != nil {
			s.Source = src
		} else {
			s.Elements = a.elements[decl]
		}
		if size := declaredSize(decl, s.Len()); size > 0 {
			s.Size = size
		}
		return &s
	}
	for _, s := range c.fixedSets() {
		rs.Sets = append(rs.Sets, withElements(s))
	}
	rs.Chains = append(c.baseChains(), c.fixedChains()...)
	for _, o := range objs {
		rs.Chains = append(rs.Chains, c.sharedChain(o))
	}
	return rs
}

// assemble builds the ruleset of every service port of snap.
func (c *compiler) assemble(snap *k8s.Snapshot) *m.Ruleset {
	a := c.newAssembly(c.sizeHint(snap))
	for i := range snap.Services {
		a.add(c.piece(&snap.Services[i]))
	}
	return a.ruleset()
}

// runSource makes the elements of an endpoint map at a full sync: the
// pieces' own elements of it, then every slot of every run.
type runSource struct {
	fixed []m.Element
	runs  []slotRun
	ends  []int // ends[i] is the number of elements up to the end of runs[i]
	// at is the run of the last element made: the batch asks for them in
	// order, so most calls find theirs without a search.
	at int
}

func newRunSource(fixed []m.Element, runs []slotRun) *runSource {
	s := &runSource{fixed: fixed, runs: runs, ends: make([]int, len(runs))}
	n := len(fixed)
	for i, r := range runs {
		n += r.eps.len()
		s.ends[i] = n
	}
	return s
}

func (s *runSource) Len() int {
	if len(s.ends) == 0 {
		return len(s.fixed)
	}
	return s.ends[len(s.ends)-1]
}

func (s *runSource) Element(i int, e *m.Element) {
	if i < len(s.fixed) {
		f := &s.fixed[i]
		*e = m.Element{Key: append(e.Key[:0], f.Key...), Data: append(e.Data[:0], f.Data...), Verdict: f.Verdict, Comment: f.Comment}
		return
	}
	j := s.at
	if !s.within(i, j) {
		j, _ = slices.BinarySearch(s.ends, i+1)
		s.at = j
	}
	r := &s.runs[j]
	if cap(e.Key) < len(r.key)+1 {
		e.Key = make([]m.Value, len(r.key)+1)
	}
	if cap(e.Data) < 2 {
		e.Data = make([]m.Value, 2)
	}
	*e = r.element(i-s.start(j), e.Key, e.Data)
}

// start is the number of the first element of run j.
func (s *runSource) start(j int) int {
	if j > 0 {
		return s.ends[j-1]
	}
	return len(s.fixed)
}

// within tells whether element i (past the fixed ones) is in run j.
func (s *runSource) within(i, j int) bool {
	return j < len(s.ends) && i < s.ends[j] && i >= s.start(j)
}

// addrSource makes the elements of a set of addresses, each address once
// in parts parts (hairpin's pairs, the cluster IPs), in address order: a
// sort, not a map, is the cheap way to drop duplicates at a full sync's
// size.
type addrSource struct {
	addrs []netip.Addr // sorted, each once
	parts int
}

func (s addrSource) Len() int { return len(s.addrs) }

func (s addrSource) Element(i int, e *m.Element) {
	k := e.Key[:0]
	for range s.parts {
		k = append(k, m.A(s.addrs[i]))
	}
	*e = m.Element{Key: k}
}

func hairpinElement(a netip.Addr) m.Element   { return m.Element{Key: []m.Value{m.A(a), m.A(a)}} }
func clusterIPElement(a netip.Addr) m.Element { return m.Element{Key: []m.Value{m.A(a)}} }

// sizedFrom is the element count from which a set is declared with a size:
// the kernel then fills a hash table of fixed size, not one it resizes as
// it goes, which takes a third less of its time for a full sync (10,000
// services of 3 endpoints: 107 -> 67 ms, BenchmarkKernelSync), and a
// quarter less at 1,000 services, whose sets of a few thousand elements
// were below the first threshold of 4,096. A smaller set keeps the
// resizable table, which costs no memory it doesn't use: sizing sets from
// 64 elements on gained nothing more.
var sizedFrom = 512

// declaredSize is the size a set of n elements is declared with: none below
// sizedFrom, else the power of two from 2n, so that it can double before a
// sync must declare it again (see incremental.fits). A set with a timeout
// keeps the size of its own declaration, and an interval set (the kernel's
// pipapo) has none.
func declaredSize(decl *m.Set, n int) uint32 {
	if decl.Timeout > 0 || decl.Interval || n < sizedFrom {
		return 0
	}
	return 1 << bits.Len(uint(2*n-1))
}

// sortedAddrs sorts addrs in place and drops the duplicates.
func sortedAddrs(addrs []netip.Addr) []netip.Addr {
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

func jump(chain string) m.Rule {
	return m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Jump, Chain: chain}}}
}

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

// localnetGuard is kube-proxy's rule against CVE-2020-8558: with
// route_localnet set (--localhost-nodeports), a neighbour could reach the
// node's 127.0.0.1 services with a frame addressed to the node. Drop packets
// to 127.0.0.0/8 that come from elsewhere, unless they belong to a
// connection that is established, related or DNATed (a localhost NodePort).
func (c *compiler) localnetGuard() (m.Rule, bool) {
	if !c.cfg.LocalhostNodePorts || c.cfg.Family != m.IPv4 {
		return m.Rule{}, false
	}
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	return m.Rule{Exprs: []m.Expr{
		m.MatchPrefix{Field: m.FieldDaddr, Prefix: loopback},
		m.MatchPrefix{Field: m.FieldSaddr, Prefix: loopback, Negate: true},
		m.MatchCtStateEstablished{Negate: true},
		m.MatchCtStatusDNAT{Negate: true},
		m.Verdict{Kind: m.Drop},
	}, Comment: c.localnetComment()}, true
}

// The localnet guard's comments: the second says nftproxy set route_localnet.
const (
	localnetGuardComment = "block incoming localnet connections"
	localnetOwnedComment = localnetGuardComment + "; route_localnet set by nftproxy"
)

func (c *compiler) localnetComment() string {
	if c.cfg.RouteLocalnetOwned {
		return localnetOwnedComment
	}
	return localnetGuardComment
}

// RouteLocalnetOwned tells whether rs, an IPv4 table read from the kernel,
// says that nftproxy turned route_localnet on.
func RouteLocalnetOwned(rs *m.Ruleset) bool {
	if rs == nil {
		return false
	}
	for _, ch := range rs.Chains {
		if ch.Name != chainFilterInput {
			continue
		}
		for _, r := range ch.Rules {
			if r.Comment == localnetOwnedComment {
				return true
			}
		}
	}
	return false
}

// nodePortPrefixes are the destinations NodePorts answer on in the compiled
// family; nil means every local address.
func (c *compiler) nodePortPrefixes() []netip.Prefix {
	if c.cfg.NodePortPrimary {
		if a := c.primaryAddr(); a.IsValid() && !a.IsLoopback() {
			return []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}
		}
		return nil
	}
	var out []netip.Prefix
	for _, p := range c.cfg.NodePortAddresses {
		if !c.cfg.inFamily(p) {
			continue
		}
		if p.Bits() == 0 {
			return nil
		}
		out = append(out, p.Masked())
	}
	return out
}

// primaryAddr is the node's primary address of the compiled family, as
// kube-proxy picks it: bindAddress, else the Node's first address.
func (c *compiler) primaryAddr() netip.Addr { return primaryAddr(c.cfg, &c.node) }

func primaryAddr(cfg Config, node *k8s.Node) netip.Addr {
	if cfg.addrInFamily(cfg.BindAddress) && !cfg.BindAddress.IsUnspecified() {
		return cfg.BindAddress
	}
	for _, a := range node.Addrs {
		if cfg.addrInFamily(a) {
			return a
		}
	}
	return netip.Addr{}
}

func (c *compiler) nodePortMatch() [][]m.Expr {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	localhost := c.cfg.LocalhostNodePorts && c.cfg.Family == m.IPv4
	prefixes := c.nodePortPrefixes()
	if len(prefixes) == 0 {
		if localhost {
			return [][]m.Expr{{m.MatchFibDaddrLocal{}}}
		}
		if c.cfg.Family == m.IPv6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		return [][]m.Expr{{m.MatchPrefix{Field: m.FieldDaddr, Prefix: loopback, Negate: true}, m.MatchFibDaddrLocal{}}}
	}
	if localhost && !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Overlaps(loopback) }) {
		prefixes = append(prefixes, loopback)
	}
	var out [][]m.Expr
	for _, p := range prefixes {
		out = append(out, []m.Expr{m.MatchFibDaddrLocal{}, m.MatchPrefix{Field: m.FieldDaddr, Prefix: p}})
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

// affinityCheck sends a new DNATed connection whose service entry has
// affinity to the chain of its timeout: by the entry's address and port
// before DNAT, or by its port alone for a NodePort. (A connection to
// another service's address on a port some NodePort with affinity uses is
// remembered too; no lookup ever asks for it.)
func (c *compiler) affinityCheck() *m.Chain {
	ch := &m.Chain{Name: chainAffinityCheck}
	for _, proto := range affinityProtocols {
		l4 := m.MatchL4Proto{Proto: proto}
		ch.Rules = append(ch.Rules,
			m.Rule{Exprs: []m.Expr{l4, m.VerdictMap{Key: []m.Field{m.FieldCtOriginalDaddr, m.FieldL4Proto, m.FieldCtOriginalProtoDst}, Map: mapAffinityServices}}},
			m.Rule{Exprs: []m.Expr{l4, m.VerdictMap{Key: []m.Field{m.FieldL4Proto, m.FieldCtOriginalProtoDst}, Map: mapAffinityNodePorts}}})
	}
	return ch
}

// sharedChainName is the name of a shared object's chain.
func (c *compiler) sharedChainName(o sharedObj) string {
	var name string
	switch o.kind {
	case clusterDispatch:
		name = clusterIPChain(o.n)
	case externalDispatch:
		name = externalChain(o.n)
	case nodePortDispatch:
		name = nodePortChain(o.n)
	case externalLocalDispatch:
		name = externalLocalChain(o.n, o.local)
	case nodePortLocalDispatch:
		name = nodePortLocalChain(o.n, o.local)
	case affinityUpdate:
		return affinityUpdateChain(o.n)
	}
	return affinityName(name, o)
}

// affinityName is a dispatch chain's name with session affinity:
// cluster-ip-affinity-N and so on.
func affinityName(name string, o sharedObj) string {
	if !o.affinity {
		return name
	}
	kind, counts, _ := strings.Cut(name, fmt.Sprintf("-%d", o.n))
	return fmt.Sprintf("%s-affinity-%d%s", kind, o.n, counts)
}

// sharedChain builds a dispatch chain: it marks for masquerade as its kind
// of traffic needs, then DNATs to the endpoint in a random one of n slots.
func (c *compiler) sharedChain(o sharedObj) *m.Chain {
	ch := &m.Chain{Name: c.sharedChainName(o)}
	n := uint32(o.n)
	markAll := jump(chainMarkForMasquerade)
	switch o.kind {
	case clusterDispatch:
		if r, ok := c.clusterMasquerade(); ok {
			ch.Rules = append(ch.Rules, r)
		}
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.DNATMap{Key: vipKey, Numgen: n, Map: mapEndpoints}}})
	case externalDispatch:
		ch.Rules = []m.Rule{markAll, {Exprs: []m.Expr{m.DNATMap{Key: vipKey, Numgen: n, Map: mapEndpoints}}}}
	case nodePortDispatch:
		ch.Rules = []m.Rule{markAll, {Exprs: []m.Expr{m.DNATMap{Key: nodePortKey, Numgen: n, Map: mapNodePortEndpoints}}}}
	case externalLocalDispatch:
		ch.Rules = c.localPolicyRules(o, vipKey, mapEndpoints)
	case nodePortLocalDispatch:
		ch.Rules = c.localPolicyRules(o, nodePortKey, mapNodePortEndpoints)
	case affinityUpdate:
		for _, proto := range affinityProtocols {
			ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.MatchL4Proto{Proto: proto},
				m.UpdateMap{Key: connKey, Data: connTarget, Map: mapAffinity, Timeout: time.Duration(o.n) * time.Second}}})
		}
	}
	if o.affinity {
		ch.Rules = withAffinityLookups(ch.Rules)
	}
	return ch
}

// withAffinityLookups puts before every random pick the same rule with the
// client's remembered endpoint instead: a client the affinity map doesn't
// hold makes that rule not match.
func withAffinityLookups(rules []m.Rule) []m.Rule {
	out := make([]m.Rule, 0, 2*len(rules))
	for _, r := range rules {
		last := len(r.Exprs) - 1
		if d, ok := r.Exprs[last].(m.DNATMap); ok && d.Numgen > 0 {
			lookup := m.Rule{Exprs: append(slices.Clone(r.Exprs[:last]), m.DNATMap{Key: clientKey, Map: mapAffinity})}
			out = append(out, lookup)
		}
		out = append(out, r)
	}
	return out
}

// localPolicyRules are the rules of an eTP=Local dispatch chain: pods and
// the node itself still reach every endpoint (the node's own traffic
// masqueraded, as its source can't be kept); traffic from elsewhere only
// local endpoints, with its source kept, and none is dropped.
func (c *compiler) localPolicyRules(o sharedObj, key []m.Field, endpoints string) []m.Rule {
	cluster := m.DNATMap{Key: key, Numgen: uint32(o.n), Map: endpoints}
	var rules []m.Rule
	if match, ok := c.localTraffic(false); ok {
		rules = append(rules, m.Rule{Exprs: append(match, cluster), Comment: "pod traffic stays cluster-wide"})
	}
	rules = append(rules,
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}},
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, cluster}, Comment: "node traffic stays cluster-wide"})
	if o.local == 0 {
		return append(rules, m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Drop}}, Comment: "no local endpoints"})
	}
	local := m.DNATMap{Key: key, Numgen: uint32(o.local), Offset: localSlotOffset, Map: endpoints}
	return append(rules, m.Rule{Exprs: []m.Expr{local}})
}

// masqueradeMark is the mark bit that asks for masquerade.
func (c *compiler) masqueradeMark() uint32 {
	if c.cfg.MasqueradeBit == 0 {
		return markMasquerade
	}
	return 1 << c.cfg.MasqueradeBit
}

// localTraffic matches traffic from this cluster's pods as the detect-local
// mode says (negate: traffic from anywhere else); ok is false when the mode
// knows no local traffic for the compiled family.
func (c *compiler) localTraffic(negate bool) ([]m.Expr, bool) {
	prefix := func(ps []netip.Prefix) ([]m.Expr, bool) {
		for _, p := range ps {
			if c.cfg.inFamily(p) {
				return []m.Expr{m.MatchPrefix{Field: m.FieldSaddr, Prefix: p.Masked(), Negate: negate}}, true
			}
		}
		return nil, false
	}
	switch c.cfg.DetectLocal.Mode {
	case "", LocalClusterCIDR:
		return prefix(c.cfg.ClusterCIDRs)
	case LocalNodeCIDR:
		return prefix(c.node.PodCIDRs)
	case LocalBridgeInterface:
		return []m.Expr{m.MatchIifname{Name: c.cfg.DetectLocal.Interface, Negate: negate}}, true
	case LocalInterfaceNamePrefix:
		return []m.Expr{m.MatchIifname{Name: c.cfg.DetectLocal.Interface + "*", Negate: negate}}, true
	}
	return nil, false
}

// clusterMasquerade is the rule that marks ClusterIP traffic for masquerade:
// everything with --masquerade-all, else what does not come from the
// cluster's pods, as the detect-local mode tells them.
func (c *compiler) clusterMasquerade() (m.Rule, bool) {
	if c.cfg.MasqueradeAll {
		return jump(chainMarkForMasquerade), true
	}
	match, ok := c.localTraffic(true)
	if !ok {
		return m.Rule{}, false
	}
	return m.Rule{Exprs: append(match, m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade})}, true
}
