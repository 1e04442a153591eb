package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Fixed addresses of the topology. The client network is outside the cluster
// CIDR on purpose: traffic from it must be masqueraded by the proxy.
var (
	ClientAddr   = netip.MustParseAddr("192.168.77.2")
	ClientAddr6  = netip.MustParseAddr("fd77::2")
	NodeAddr     = netip.MustParseAddr("192.168.77.1")
	NodeAddr6    = netip.MustParseAddr("fd77::1")
	BridgeAddr   = netip.MustParseAddr("10.244.1.1")
	BridgeAddr6  = netip.MustParseAddr("fd00:10:244:1::1")
	ClientCIDR   = netip.MustParsePrefix("192.168.77.0/24")
	ClientCIDR6  = netip.MustParsePrefix("fd77::/64")
	PodCIDR      = netip.MustParsePrefix("10.244.1.0/24")
	PodCIDR6     = netip.MustParsePrefix("fd00:10:244:1::/64")
	ClusterCIDR  = netip.MustParsePrefix("10.244.0.0/16")
	ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/48")
)

// Interface names inside the namespaces.
const (
	// BridgeName is the pod bridge in the node namespace.
	BridgeName = "br0"
	// NodeUplink is the node's veth towards the client namespace.
	NodeUplink = "eth0"
	// PodIface is the interface name in the client and every pod namespace.
	PodIface = "eth0"
)

// maxPods keeps pod addresses (.10 .. .99) below the in-cluster client (.100).
const maxPods = 90

// TopologyOptions chooses the shape of a Topology.
type TopologyOptions struct {
	// Prefix starts every namespace name; default "np".
	Prefix string
	// Pods is the number of pod namespaces; 0 means 3, at most 90.
	Pods int
	// InClusterClient adds a pod namespace on the bridge (10.244.1.100) that
	// serves nothing, for in-cluster client traffic that no endpoint sends.
	InClusterClient bool
}

// Topology is client ns ↔ veth ↔ node ns (router, where the proxy's rules go)
// ↔ br0 ↔ pod namespaces. Use the package-level address variables
// (ClientAddr, NodeAddr, ...) for the fixed addresses; pod addresses are in Pods.
type Topology struct {
	Client *NS
	Node   *NS
	Pods   []*Pod
	// InClusterClient is nil unless TopologyOptions.InClusterClient was set.
	InClusterClient *Pod

	// The fixed addresses again (same values as the package variables), so a
	// scenario can read everything off the topology.
	ClientAddr, ClientAddr6 netip.Addr // the client, outside the cluster CIDR
	NodeAddr, NodeAddr6     netip.Addr // the node's client-facing address, for NodePorts
	BridgeAddr, BridgeAddr6 netip.Addr // the node on the pod bridge, pods' gateway

	// BridgeNFErr says why net.bridge.bridge-nf-call-ip{,6}tables could not be
	// set in the node namespace; nil when they are 1. Without it, a pod
	// reaching a service that picks a pod on the same bridge is not NATed.
	BridgeNFErr error
}

// Pod is a pod namespace with eth0 on the node's bridge.
type Pod struct {
	NS *NS
	// Name is what the pod's servers answer.
	Name  string
	Addr  netip.Addr // IPv4 on eth0
	Addr6 netip.Addr // IPv6 on eth0

	servers serverSet
}

// NewTopology builds a topology for a test and closes it in t.Cleanup.
func NewTopology(t testing.TB, opts TopologyOptions) *Topology {
	t.Helper()
	Require(t)
	topo, err := BuildTopology(opts)
	if err != nil {
		t.Fatalf("build topology: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("close topology: %v", err)
		}
	})
	if topo.BridgeNFErr != nil {
		t.Logf("bridge netfilter unavailable: %v", topo.BridgeNFErr)
	}
	return topo
}

// BuildTopology creates the namespaces and links. On error everything made so
// far is removed.
func BuildTopology(opts TopologyOptions) (*Topology, error) {
	if opts.Prefix == "" {
		opts.Prefix = "np"
	}
	if opts.Pods == 0 {
		opts.Pods = 3
	}
	if opts.Pods < 0 || opts.Pods > maxPods {
		return nil, fmt.Errorf("build topology: %d pods, want 1..%d", opts.Pods, maxPods)
	}
	t := &Topology{
		ClientAddr: ClientAddr, ClientAddr6: ClientAddr6,
		NodeAddr: NodeAddr, NodeAddr6: NodeAddr6,
		BridgeAddr: BridgeAddr, BridgeAddr6: BridgeAddr6,
	}
	if err := t.build(opts); err != nil {
		return nil, errors.Join(fmt.Errorf("build topology: %w", err), t.Close())
	}
	return t, nil
}

func (t *Topology) build(opts TopologyOptions) error {
	var err error
	if t.Client, err = createTuned(opts.Prefix + "c"); err != nil {
		return err
	}
	if t.Node, err = createTuned(opts.Prefix + "n"); err != nil {
		return err
	}
	for i := range opts.Pods {
		p, err := newPod(opts.Prefix+fmt.Sprintf("p%d", i), fmt.Sprintf("pod-%d", i), 10+i)
		if err != nil {
			return err
		}
		t.Pods = append(t.Pods, p)
	}
	if opts.InClusterClient {
		if t.InClusterClient, err = newPod(opts.Prefix+"x", "in-cluster-client", 100); err != nil {
			return err
		}
	}

	if err := t.Node.Sysctls(map[string]string{
		"net/ipv4/ip_forward":              "1",
		"net/ipv6/conf/all/forwarding":     "1",
		"net/ipv6/conf/default/forwarding": "1",
	}); err != nil {
		return err
	}
	t.BridgeNFErr = t.Node.enableBridgeNF()

	// Every link is created from inside the node namespace with its peer
	// placed straight into the other namespace, so nothing ever appears in
	// the host namespace and nothing routes to the host's uplink.
	cmds := []string{
		fmt.Sprintf("link add %s type veth peer name %s netns %s", NodeUplink, PodIface, t.Client.Name()),
		fmt.Sprintf("link set %s up", NodeUplink),
		fmt.Sprintf("addr add %s/%d dev %s", NodeAddr, ClientCIDR.Bits(), NodeUplink),
		fmt.Sprintf("addr add %s/%d dev %s nodad", NodeAddr6, ClientCIDR6.Bits(), NodeUplink),
	}
	cmds = append(cmds, podBridge(t.allPods(),
		netip.PrefixFrom(BridgeAddr, PodCIDR.Bits()), netip.PrefixFrom(BridgeAddr6, PodCIDR6.Bits()))...)
	if err := t.Node.IPBatch(cmds...); err != nil {
		return err
	}

	if err := t.Client.IPBatch(
		fmt.Sprintf("link set %s up", PodIface),
		fmt.Sprintf("addr add %s/%d dev %s", ClientAddr, ClientCIDR.Bits(), PodIface),
		fmt.Sprintf("addr add %s/%d dev %s nodad", ClientAddr6, ClientCIDR6.Bits(), PodIface),
		fmt.Sprintf("route add default via %s dev %s", NodeAddr, PodIface),
		fmt.Sprintf("route add default via %s dev %s", NodeAddr6, PodIface),
	); err != nil {
		return err
	}
	for _, p := range t.allPods() {
		if err := p.NS.IPBatch(
			fmt.Sprintf("link set %s up", PodIface),
			fmt.Sprintf("addr add %s/%d dev %s", p.Addr, PodCIDR.Bits(), PodIface),
			fmt.Sprintf("addr add %s/%d dev %s nodad", p.Addr6, PodCIDR6.Bits(), PodIface),
			fmt.Sprintf("route add default via %s dev %s", BridgeAddr, PodIface),
			fmt.Sprintf("route add default via %s dev %s", BridgeAddr6, PodIface),
		); err != nil {
			return err
		}
	}
	if err := t.Node.fastNeighbours(NodeUplink, BridgeName); err != nil {
		return err
	}
	for _, n := range append([]*NS{t.Client}, podNamespaces(t.allPods())...) {
		if err := n.fastNeighbours(PodIface); err != nil {
			return err
		}
	}
	return t.waitRunning()
}

// podBridge returns the ip commands, run in the node namespace, that create
// the pod bridge with the gateway addresses and a veth port named vethp<i>
// towards each pod's PodIface.
func podBridge(pods []*Pod, gateways ...netip.Prefix) []string {
	cmds := []string{
		// STP off and no forward delay: ports forward as soon as they are up.
		// No multicast snooping so IPv6 neighbour discovery is simply flooded.
		fmt.Sprintf("link add %s type bridge forward_delay 0 stp_state 0 mcast_snooping 0", BridgeName),
		fmt.Sprintf("link set %s up", BridgeName),
	}
	for _, gw := range gateways {
		nodad := "" // an IPv6 address is usable at once, without duplicate detection
		if gw.Addr().Is6() {
			nodad = " nodad"
		}
		cmds = append(cmds, fmt.Sprintf("addr add %s dev %s%s", gw, BridgeName, nodad))
	}
	for i, p := range pods {
		port := fmt.Sprintf("vethp%d", i)
		cmds = append(cmds,
			fmt.Sprintf("link add %s type veth peer name %s netns %s", port, PodIface, p.NS.Name()),
			fmt.Sprintf("link set %s master %s", port, BridgeName),
			// Hairpin lets a pod reach itself through a service VIP.
			fmt.Sprintf("link set %s type bridge_slave hairpin on", port),
			fmt.Sprintf("link set %s up", port),
		)
	}
	return cmds
}

// fastNeighbours makes ARP and neighbour discovery retry after 100 ms instead
// of 1 s. On a busy machine a first solicitation is now and then lost, and
// the default retry comes too late for a test waiting a second; an absent
// host still fails fast (5 tries). Namespaces have no "default" neighbour
// sysctls, so this is set per interface.
func (n *NS) fastNeighbours(devs ...string) error {
	kv := map[string]string{}
	for _, dev := range devs {
		for _, fam := range []string{"ipv4", "ipv6"} {
			kv["net/"+fam+"/neigh/"+dev+"/retrans_time_ms"] = "100"
			kv["net/"+fam+"/neigh/"+dev+"/mcast_solicit"] = "5"
		}
	}
	return n.Sysctls(kv)
}

// waitRunning waits for every link of the topology to carry packets.
func (t *Topology) waitRunning() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodeLinks := []string{NodeUplink, BridgeName}
	for i := range t.allPods() {
		nodeLinks = append(nodeLinks, fmt.Sprintf("vethp%d", i))
	}
	if err := t.Node.WaitRunning(ctx, nodeLinks...); err != nil {
		return err
	}
	for _, n := range append([]*NS{t.Client}, podNamespaces(t.allPods())...) {
		if err := n.WaitRunning(ctx, PodIface); err != nil {
			return err
		}
	}
	return nil
}

func podNamespaces(pods []*Pod) []*NS {
	ns := make([]*NS, 0, len(pods))
	for _, p := range pods {
		ns = append(ns, p.NS)
	}
	return ns
}

// createTuned creates a namespace without IPv6 duplicate address detection
// (addresses usable at once) and without ICMP rate limits (so tests that
// expect "refused" many times in a row don't see timeouts instead).
func createTuned(prefix string) (*NS, error) {
	n, err := Create(prefix)
	if err != nil {
		return nil, err
	}
	if err := n.Sysctls(map[string]string{
		"net/ipv6/conf/all/accept_dad":     "0",
		"net/ipv6/conf/default/accept_dad": "0",
		"net/ipv4/icmp_ratelimit":          "0",
		"net/ipv6/icmp/ratelimit":          "0",
	}); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

func newPod(prefix, name string, host int) (*Pod, error) {
	n, err := createTuned(prefix)
	if err != nil {
		return nil, err
	}
	v4 := PodCIDR.Addr().As4()
	v4[3] = byte(host)
	// The IPv6 host part is written with the same digits as the IPv4 one
	// (.10 ↔ ::10) so the pairs are easy to read in listings.
	v6, err := netip.ParseAddr(fmt.Sprintf("%s%d", PodCIDR6.Addr(), host))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("make pod address: %w", err), n.Close())
	}
	return &Pod{NS: n, Name: name, Addr: netip.AddrFrom4(v4), Addr6: v6}, nil
}

// enableBridgeNF sets bridge-nf-call-ip{,6}tables, loading br_netfilter if
// the sysctls don't exist yet.
func (n *NS) enableBridgeNF() error {
	const v4 = "net/bridge/bridge-nf-call-iptables"
	if _, err := os.Stat("/proc/sys/" + v4); err != nil {
		if out, err := exec.Command("modprobe", "br_netfilter").CombinedOutput(); err != nil {
			return fmt.Errorf("load br_netfilter: %w: %s", err, out)
		}
	}
	return n.Sysctls(map[string]string{
		v4:                                    "1",
		"net/bridge/bridge-nf-call-ip6tables": "1",
	})
}

func (t *Topology) allPods() []*Pod {
	pods := append([]*Pod(nil), t.Pods...)
	if t.InClusterClient != nil {
		pods = append(pods, t.InClusterClient)
	}
	return pods
}

// Pod returns the pod with the given name, or nil.
func (t *Topology) Pod(name string) *Pod {
	for _, p := range t.allPods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Close stops every pod server and deletes every namespace, also after a
// partial build. Deleting the node namespace removes all veths and the bridge.
func (t *Topology) Close() error {
	var errs []error
	for _, p := range t.allPods() {
		p.servers.stopAll()
	}
	for _, p := range t.allPods() {
		if p != nil && p.NS != nil {
			errs = append(errs, p.NS.Close())
		}
	}
	for _, n := range []*NS{t.Node, t.Client} {
		if n != nil {
			errs = append(errs, n.Close())
		}
	}
	return errors.Join(errs...)
}
