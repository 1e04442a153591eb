package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// Addresses of a ClusterTopology. Node i (from 1) is 172.20.i.2 on its
// point-to-point link to the fabric (172.20.i.1) and owns pod CIDR
// 10.244.i.0/24 on its bridge (10.244.i.1, pods from .10). The fabric also
// has FabricAddr on its loopback, reachable from every namespace (the API
// server relay listens there), and routes the load balancer's address to the
// load-balancer namespace. Nothing has a route to the host's uplink: every
// namespace's default route ends in the fabric, which has none.
var (
	FabricAddr         = netip.MustParseAddr("172.20.0.1")
	ClusterClientAddr  = netip.MustParseAddr("192.168.77.2")
	ClusterClientGW    = netip.MustParseAddr("192.168.77.1")
	LoadBalancerNSAddr = netip.MustParseAddr("192.168.78.2")
	LoadBalancerGW     = netip.MustParseAddr("192.168.78.1")
	// LoadBalancerIP is the address the load-balancer namespace serves,
	// routed to it by the fabric.
	LoadBalancerIP = netip.MustParseAddr("192.168.79.100")
)

// ClusterOptions choose the shape of a ClusterTopology.
type ClusterOptions struct {
	// Prefix starts every namespace name; default "npk".
	Prefix string
	// Nodes is the number of nodes; 0 means 3, at most 200.
	Nodes int
	// PodsPerNode is the number of pod namespaces per node; 0 means 2, at
	// most 90.
	PodsPerNode int
	// KubeletPods leaves the pods to a kubelet and its CNI plugin: the
	// nodes get no pod namespaces and no bridge, only their uplink and the
	// fabric's route for their pod CIDR. PodsPerNode is ignored.
	KubeletPods bool
}

// ClusterTopology is several nodes behind a routing fabric, like a cluster
// on a flat-routed CNI:
//
//	client ns ─┐                  ┌─ node-1 ns ─ br0 ─ pods 10.244.1.10, .11, ...
//	lb ns ─────┼─ fabric ns ──────┼─ node-2 ns ─ br0 ─ pods 10.244.2.10, ...
//	           │  (router,        └─ node-3 ns ─ br0 ─ ...
//	           │   pod CIDR routes, 172.20.0.1 on lo)
//
// Nodes reach each other's pods through the fabric (a route per pod CIDR
// towards the node that owns it), and the fabric itself from anywhere.
type ClusterTopology struct {
	Fabric       *NS
	Client       *NS
	LoadBalancer *NS
	Nodes        []*ClusterNode
}

// ClusterNode is one node namespace with its pods.
type ClusterNode struct {
	NS *NS
	// Name is the node's Kubernetes name, node-1, node-2, ...
	Name    string
	Index   int        // 1, 2, ...
	Addr    netip.Addr // on the link to the fabric: the node's InternalIP
	PodCIDR netip.Prefix
	Bridge  netip.Addr // the pods' gateway
	Pods    []*Pod

	kubeletPods bool // no bridge: the CNI plugin makes it
}

// BuildCluster creates the namespaces and links. On error everything made
// so far is removed.
func BuildCluster(opts ClusterOptions) (*ClusterTopology, error) {
	if opts.Prefix == "" {
		opts.Prefix = "npk"
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.PodsPerNode == 0 || opts.KubeletPods {
		opts.PodsPerNode = 2
	}
	if opts.Nodes < 1 || opts.Nodes > 200 || opts.PodsPerNode < 1 || opts.PodsPerNode > maxPods {
		return nil, fmt.Errorf("build cluster: %d nodes of %d pods, want 1..200 of 1..%d", opts.Nodes, opts.PodsPerNode, maxPods)
	}
	c := &ClusterTopology{}
	if err := c.build(opts); err != nil {
		return nil, errors.Join(fmt.Errorf("build cluster: %w", err), c.Close())
	}
	return c, nil
}

// NewCluster builds a cluster topology for a test and closes it in t.Cleanup.
func NewCluster(t testing.TB, opts ClusterOptions) *ClusterTopology {
	t.Helper()
	Require(t)
	c, err := BuildCluster(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster topology: %v", err)
		}
	})
	return c
}

func (c *ClusterTopology) build(opts ClusterOptions) error {
	if err := c.createNamespaces(opts); err != nil {
		return err
	}
	links, err := c.wireFabric()
	if err != nil {
		return err
	}
	if err := c.wireEdges(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.build(); err != nil {
			return err
		}
	}
	return c.waitRunning(links)
}

// createNamespaces creates every namespace of the topology, each recorded
// as soon as it exists so that Close removes it on error.
func (c *ClusterTopology) createNamespaces(opts ClusterOptions) error {
	var err error
	if c.Fabric, err = createTuned(opts.Prefix + "f"); err != nil {
		return err
	}
	if c.Client, err = createTuned(opts.Prefix + "c"); err != nil {
		return err
	}
	if c.LoadBalancer, err = createTuned(opts.Prefix + "l"); err != nil {
		return err
	}
	for i := 1; i <= opts.Nodes; i++ {
		n := newClusterNode(i)
		c.Nodes = append(c.Nodes, n)
		if n.NS, err = createTuned(fmt.Sprintf("%sn%d", opts.Prefix, i)); err != nil {
			return err
		}
		if opts.KubeletPods {
			n.kubeletPods = true
			continue
		}
		for j := range opts.PodsPerNode {
			p, err := createTuned(fmt.Sprintf("%sn%dp%d", opts.Prefix, i, j))
			if err != nil {
				return err
			}
			n.Pods = append(n.Pods, &Pod{NS: p, Name: fmt.Sprintf("node-%d-pod-%d", i, j),
				Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(10 + j)})})
		}
	}
	return nil
}

// newClusterNode is node i's description, its namespace not created yet.
func newClusterNode(i int) *ClusterNode {
	return &ClusterNode{Name: fmt.Sprintf("node-%d", i), Index: i,
		Addr:    netip.AddrFrom4([4]byte{172, 20, byte(i), 2}),
		PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
		Bridge:  netip.AddrFrom4([4]byte{10, 244, byte(i), 1}),
	}
}

// wireFabric makes the fabric a router with a link to every other
// namespace but the pods', and returns the names of its links.
func (c *ClusterTopology) wireFabric() ([]string, error) {
	// The fabric routes and answers; it sends no redirects (its links are
	// point to point anyway) and has no default route.
	if err := c.Fabric.Sysctls(map[string]string{
		"net/ipv4/ip_forward":                  "1",
		"net/ipv4/conf/all/send_redirects":     "0",
		"net/ipv4/conf/default/send_redirects": "0",
	}); err != nil {
		return nil, err
	}
	cmds, links := c.fabricCommands()
	if err := c.Fabric.IPBatch(cmds...); err != nil {
		return nil, err
	}
	if err := c.Fabric.fastNeighbours(links...); err != nil {
		return nil, err
	}
	return links, nil
}

// fabricCommands are the ip commands that wire the fabric, and the names of
// the links they make. Links are created in the fabric with the peer placed
// straight into the other namespace: nothing ever appears in the host
// namespace.
func (c *ClusterTopology) fabricCommands() (cmds, links []string) {
	cmds = []string{
		fmt.Sprintf("addr add %s/32 dev lo", FabricAddr),
		fmt.Sprintf("link add cli type veth peer name %s netns %s", PodIface, c.Client.Name()),
		"link set cli up",
		fmt.Sprintf("addr add %s/24 dev cli", ClusterClientGW),
		fmt.Sprintf("link add lb type veth peer name %s netns %s", PodIface, c.LoadBalancer.Name()),
		"link set lb up",
		fmt.Sprintf("addr add %s/24 dev lb", LoadBalancerGW),
		fmt.Sprintf("route add %s/32 via %s dev lb", LoadBalancerIP, LoadBalancerNSAddr),
	}
	links = []string{"cli", "lb"}
	for _, n := range c.Nodes {
		link := fmt.Sprintf("n%d", n.Index)
		links = append(links, link)
		cmds = append(cmds,
			fmt.Sprintf("link add %s type veth peer name %s netns %s", link, NodeUplink, n.NS.Name()),
			fmt.Sprintf("link set %s up", link),
			fmt.Sprintf("addr add %s/24 dev %s", n.gateway(), link),
			// The flat-routed CNI's part: each pod CIDR towards its node.
			fmt.Sprintf("route add %s via %s dev %s", n.PodCIDR, n.Addr, link),
		)
	}
	return cmds, links
}

// wireEdges sets up the client's and the load balancer's ends of their
// links to the fabric.
func (c *ClusterTopology) wireEdges() error {
	for _, ns := range []struct {
		ns       *NS
		addr, gw netip.Addr
		extra    []string
	}{
		{c.Client, ClusterClientAddr, ClusterClientGW, nil},
		// The balancer's own address for the service it fronts.
		{c.LoadBalancer, LoadBalancerNSAddr, LoadBalancerGW, []string{fmt.Sprintf("addr add %s/32 dev lo", LoadBalancerIP)}},
	} {
		cmds := append([]string{
			fmt.Sprintf("link set %s up", PodIface),
			fmt.Sprintf("addr add %s/24 dev %s", ns.addr, PodIface),
			fmt.Sprintf("route add default via %s dev %s", ns.gw, PodIface),
		}, ns.extra...)
		if err := ns.ns.IPBatch(cmds...); err != nil {
			return err
		}
		if err := ns.ns.fastNeighbours(PodIface); err != nil {
			return err
		}
	}
	return nil
}

// gateway is the fabric's address on the node's link.
func (n *ClusterNode) gateway() netip.Addr {
	return netip.AddrFrom4([4]byte{172, 20, byte(n.Index), 1})
}

func (n *ClusterNode) build() error {
	if err := n.NS.Sysctls(map[string]string{
		"net/ipv4/ip_forward":                    "1",
		"net/ipv4/conf/all/accept_redirects":     "0",
		"net/ipv4/conf/default/accept_redirects": "0",
	}); err != nil {
		return err
	}
	if err := n.NS.enableBridgeNF(); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	cmds := []string{
		fmt.Sprintf("link set %s up", NodeUplink),
		fmt.Sprintf("addr add %s/24 dev %s", n.Addr, NodeUplink),
		fmt.Sprintf("route add default via %s dev %s", n.gateway(), NodeUplink),
	}
	links := []string{NodeUplink}
	if !n.kubeletPods {
		cmds = append(cmds, podBridge(n.Pods, netip.PrefixFrom(n.Bridge, n.PodCIDR.Bits()))...)
		links = append(links, BridgeName)
	}
	if err := n.NS.IPBatch(cmds...); err != nil {
		return err
	}
	if err := n.NS.fastNeighbours(links...); err != nil {
		return err
	}
	for _, p := range n.Pods {
		if err := p.NS.IPBatch(
			fmt.Sprintf("link set %s up", PodIface),
			fmt.Sprintf("addr add %s/%d dev %s", p.Addr, n.PodCIDR.Bits(), PodIface),
			fmt.Sprintf("route add default via %s dev %s", n.Bridge, PodIface),
		); err != nil {
			return err
		}
		if err := p.NS.fastNeighbours(PodIface); err != nil {
			return err
		}
	}
	return nil
}

func (c *ClusterTopology) waitRunning(fabricLinks []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Fabric.WaitRunning(ctx, fabricLinks...); err != nil {
		return err
	}
	for _, ns := range []*NS{c.Client, c.LoadBalancer} {
		if err := ns.WaitRunning(ctx, PodIface); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		links := []string{NodeUplink}
		if !n.kubeletPods {
			links = append(links, BridgeName)
		}
		for i := range n.Pods {
			links = append(links, fmt.Sprintf("vethp%d", i))
		}
		if err := n.NS.WaitRunning(ctx, links...); err != nil {
			return err
		}
		for _, p := range n.Pods {
			if err := p.NS.WaitRunning(ctx, PodIface); err != nil {
				return err
			}
		}
	}
	return nil
}

// Pods returns every pod of every node, node by node.
func (c *ClusterTopology) Pods() []*Pod {
	var pods []*Pod
	for _, n := range c.Nodes {
		pods = append(pods, n.Pods...)
	}
	return pods
}

// Node returns the node named name, or nil.
func (c *ClusterTopology) Node(name string) *ClusterNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Namespaces lists every namespace of the topology, for printing.
func (c *ClusterTopology) Namespaces() []*NS {
	var all []*NS
	for _, ns := range []*NS{c.Fabric, c.Client, c.LoadBalancer} {
		if ns != nil {
			all = append(all, ns)
		}
	}
	for _, n := range c.Nodes {
		if n.NS != nil {
			all = append(all, n.NS)
		}
		for _, p := range n.Pods {
			all = append(all, p.NS)
		}
	}
	return all
}

// Close stops every pod server and deletes every namespace, also after a
// partial build.
func (c *ClusterTopology) Close() error {
	var errs []error
	for _, p := range c.Pods() {
		p.servers.stopAll()
	}
	for _, ns := range c.Namespaces() {
		errs = append(errs, ns.Close())
	}
	return errors.Join(errs...)
}
