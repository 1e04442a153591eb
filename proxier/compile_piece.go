// The piece of one service port: its elements of the dispatch maps and its endpoints' slots.

package proxier

import (
	"net/netip"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// rejectVerdict answers traffic to a service port without endpoints.
var rejectVerdict = &m.Verdict{Kind: m.Goto, Chain: chainReject}

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
	e := r.eps.addrPort(i)
	d := append(data[:0:2], m.A(e.Addr()), m.N(uint32(e.Port())))
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

// piece compiles one service port: its ClusterIPs, its external
// addresses (external IPs and load balancer IPs) and its node port.
func (c *compiler) piece(sp *k8s.ServicePort) *piece {
	return c.build(sp, nil)
}

// build compiles sp's piece, from its endpoints or, with pre, from its lists
// in slot order.
func (c *compiler) build(sp *k8s.ServicePort, pre *[2]slotList) *piece {
	// Like kube-proxy, a family's table only serves services with a
	// ClusterIP of that family: an external or load balancer address of the
	// other family is not the service's business there.
	if !c.hasFamilyAddress(sp) {
		return &piece{}
	}
	b := c.newPieceBuilder(sp, pre)
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
	c      *compiler
	sp     *k8s.ServicePort
	p      *piece
	choice endpointChoice
	// pre, when set, holds the cluster-wide and the local list already in
	// slot order (a patched wide port's): nothing is chosen or ordered.
	pre     *[2]slotList
	proto   m.Value
	comment string
}

// size is the length of the cluster-wide or the local endpoint list.
func (b *pieceBuilder) size(local bool) int {
	switch {
	case b.pre != nil:
		return b.pre[boolInt(local)].len()
	case local:
		return len(b.choice.local)
	}
	return len(b.choice.cluster)
}

// order puts the cluster-wide or the local list in slot order, once per
// piece.
func (b *pieceBuilder) order(local bool) slotList {
	key := slotsKey{b.sp.Name, local}
	if b.pre == nil {
		list := b.choice.cluster
		if local {
			list = b.choice.local
		}
		return b.c.slotsOf(b.p, key, list)
	}
	l := b.pre[boolInt(local)]
	if !slices.ContainsFunc(b.p.slotOrders, func(o slotOrder) bool { return o.key == key }) {
		b.p.slotOrders = append(b.p.slotOrders, slotOrder{key: key, order: l})
	}
	return l
}

// newPieceBuilder returns the builder by value: it stays on the caller's
// stack (one allocation less per service port in a full sync).
func (c *compiler) newPieceBuilder(sp *k8s.ServicePort, pre *[2]slotList) pieceBuilder {
	b := pieceBuilder{c: c, sp: sp, p: &piece{}, pre: pre,
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
	if pre == nil {
		b.choice = chooseEndpoints(sp, &c.node, func(e *k8s.Endpoint) bool { return c.cfg.addrInFamily(e.Addr) })
		b.p.hairpin = hairpinAddrs(b.choice, c.here)
	}
	return b
}

// clusterIP dispatches traffic to one ClusterIP.
func (b *pieceBuilder) clusterIP(ip netip.Addr) {
	if !slices.Contains(b.p.clusterIPs, ip) {
		b.p.clusterIPs = append(b.p.clusterIPs, ip)
	}
	key := []m.Value{m.A(ip), b.proto, m.N(uint32(b.sp.Port))}
	local := b.sp.InternalPolicyLocal
	switch {
	case b.size(local) == 0:
		// iTP=Local without local endpoints drops, like kube-proxy;
		// no endpoints at all rejects.
		b.noEndpoints(b.c.noEndpointIPs, key, local && b.size(false) > 0)
	default:
		b.shared(b.c.serviceIPs, key, clusterDispatch, b.c.endpoints, local)
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
	case b.size(false) == 0:
		b.noEndpoints(noEndpointSet, key, false)
	case b.sp.ExternalPolicyLocal:
		b.sharedLocal(dispatchSet, key, localKind, targets)
	default:
		b.shared(dispatchSet, key, kind, targets, false)
	}
}

// sharedLocal dispatches eTP=Local traffic through the chain for its
// cluster-wide and local endpoint counts; the local endpoints take the
// slots from localSlotOffset under the same key.
func (b *pieceBuilder) sharedLocal(set *m.Set, key []m.Value, kind sharedKind, targets *m.Set) {
	cluster, local := b.order(false), b.order(true)
	obj := sharedObj{kind: kind, n: cluster.len(), local: local.len(), affinity: b.sp.AffinityTimeout > 0}
	b.dispatch(set, key, b.c.sharedChainName(obj))
	b.p.uses = append(b.p.uses, obj)
	b.remember(set, key)
	b.p.runs = append(b.p.runs, slotRun{set: b.c.endpointMap(targets, cluster.len()), key: key, eps: cluster})
	if local.len() > 0 {
		b.p.runs = append(b.p.runs, slotRun{set: b.c.endpointMap(targets, local.len()), key: key, eps: local, offset: localSlotOffset})
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

// shared dispatches through the chain of kind for the cluster-wide or the
// local endpoints and puts the one in slot i into slot i of the map targets.
func (b *pieceBuilder) shared(set *m.Set, key []m.Value, kind sharedKind, targets *m.Set, local bool) {
	order := b.order(local)
	obj := sharedObj{kind: kind, n: order.len(), affinity: b.sp.AffinityTimeout > 0}
	b.dispatch(set, key, b.c.sharedChainName(obj))
	b.p.uses = append(b.p.uses, obj)
	b.p.runs = append(b.p.runs, slotRun{set: b.c.endpointMap(targets, order.len()), key: key, eps: order})
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

// hasFamilyAddress tells whether the service has a ClusterIP of the compiled
// family: a single-stack service gets rules, NodePorts included, in its own
// family only.
func (c *compiler) hasFamilyAddress(sp *k8s.ServicePort) bool {
	return slices.ContainsFunc(sp.ClusterIPs, c.cfg.addrInFamily)
}
