package proxier

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// svc builds a TCP service port web in namespace default with n ready endpoints.
func svc(name, port string, clusterIP string, n int, mods ...func(*k8s.ServicePort)) k8s.ServicePort {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: name, Port: port, Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
		Port:       80,
	}
	for i := range n {
		sp.Endpoints = append(sp.Endpoints, k8s.Endpoint{
			Addr: netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 10+i)), Port: 8080, Ready: true, Serving: true})
	}
	for _, mod := range mods {
		mod(&sp)
	}
	return sp
}

func nodePort(p uint16) func(*k8s.ServicePort) { return func(sp *k8s.ServicePort) { sp.NodePort = p } }
func udp(sp *k8s.ServicePort)                  { sp.Name.Protocol = k8s.UDP; sp.Port = 53 }
func sctp(sp *k8s.ServicePort)                 { sp.Name.Protocol = k8s.SCTP; sp.Port = 3868 }

// local puts the first n endpoints on node-1 and the others on node-2.
func local(n int) func(*k8s.ServicePort) {
	return func(sp *k8s.ServicePort) {
		for i := range sp.Endpoints {
			sp.Endpoints[i].NodeName = "node-2"
			if i < n {
				sp.Endpoints[i].NodeName = "node-1"
			}
		}
	}
}

// dualStack gives the service an IPv6 ClusterIP and IPv6 endpoints too.
func dualStack(sp *k8s.ServicePort) {
	sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::10"))
	for i, e := range sp.Endpoints {
		sp.Endpoints = append(sp.Endpoints, k8s.Endpoint{Addr: netip.MustParseAddr(fmt.Sprintf("fd00:10:244:1::%x", 0x10+i)),
			Port: e.Port, Ready: true, Serving: true})
	}
}

var testConfig = Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, DropInvalid: true}

type goldenCase struct {
	name     string
	services []k8s.ServicePort
	cfg      Config
	node     k8s.Node
}

// compile builds the case's ruleset; cases without a configuration use
// testConfig.
func (tt goldenCase) compile() *m.Ruleset {
	cfg := tt.cfg
	if cfg.ClusterCIDRs == nil && !cfg.MasqueradeAll {
		cfg = testConfig
	}
	return Compile(&k8s.Snapshot{Services: tt.services, Node: tt.node}, cfg)
}

// goldenCases are the rulesets kept as golden text in testdata/.
func goldenCases() []goldenCase {
	return []goldenCase{
		{name: "empty"},
		{name: "clusterip-1-endpoint", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)}},
		{name: "clusterip-2-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}},
		{name: "clusterip-5-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 5)}},
		{name: "nodeport", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080))}},
		{name: "no-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0, nodePort(30080))}},
		{name: "udp", services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 2, udp)}},
		// SCTP (Diameter's port): the same maps and chains, keyed by sctp.
		{name: "sctp", services: []k8s.ServicePort{svc("diameter", "diameter", "10.96.0.30", 2, nodePort(30868), sctp)}},
		{name: "several-ports", services: []k8s.ServicePort{
			svc("web", "http", "10.96.0.10", 2),
			svc("web", "https", "10.96.0.10", 2, func(sp *k8s.ServicePort) { sp.Port = 443 }),
			svc("web", "metrics", "10.96.0.10", 1, func(sp *k8s.ServicePort) { sp.Port = 9090 }),
		}},
		{name: "masquerade-all", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			cfg: Config{Family: m.IPv4, MasqueradeAll: true}},
		{name: "nodeport-addresses", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080))},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs,
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24"), netip.MustParsePrefix("fd77::/64")}}},
		{name: "nodeport-primary", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080))},
			cfg:  Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, NodePortPrimary: true, LocalhostNodePorts: true},
			node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("fd77::1"), netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.50")}}},
		{name: "nodeport-primary-bind-address", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080))},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, NodePortPrimary: true,
				BindAddress: netip.MustParseAddr("192.168.77.50")},
			node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("192.168.77.1")}}},
		{name: "nodeport-primary-unknown", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080), dualStack)},
			cfg:  Config{Family: m.IPv6, ClusterCIDRs: testConfig.ClusterCIDRs, NodePortPrimary: true},
			node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("192.168.77.1")}}},
		{name: "nodeport-addresses-other-family", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080), dualStack)},
			cfg: Config{Family: m.IPv6, ClusterCIDRs: testConfig.ClusterCIDRs, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}}},
		{name: "detect-local-node-cidr", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080), local(1),
			func(sp *k8s.ServicePort) { sp.ExternalPolicyLocal = true })},
			cfg:  Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalNodeCIDR}},
			node: k8s.Node{Name: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}},
		{name: "detect-local-bridge", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalBridgeInterface, Interface: "br0"}}},
		{name: "detect-local-prefix", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalInterfaceNamePrefix, Interface: "veth"}}},
		{name: "detect-local-none", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalNone}}},
		{name: "masquerade-bit-13-be-liberal", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080))},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, MasqueradeBit: 13}},
		{name: "loadbalancer-externalip", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080), func(sp *k8s.ServicePort) {
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.168.77.100")}
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.168.77.200")}
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/28"), netip.MustParsePrefix("192.168.77.1/32")}
		})}, node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("192.168.77.1")}}},
		{name: "affinity", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080), func(sp *k8s.ServicePort) {
			sp.AffinityTimeout = 3 * time.Hour
		})}},
		{name: "external-policy-local", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3, nodePort(30080), local(1), func(sp *k8s.ServicePort) {
			sp.ExternalPolicyLocal = true
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.168.77.200")}
		})}, node: k8s.Node{Name: "node-1"}},
		// 64 endpoints, two of them here: the cluster-wide slots go to
		// the wide maps, the local ones to the small maps.
		{name: "wide-external-policy-local", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", wideFrom, nodePort(30080), local(2), func(sp *k8s.ServicePort) {
			sp.ExternalPolicyLocal = true
		})}, node: k8s.Node{Name: "node-1"}},
		{name: "internal-policy-local", services: []k8s.ServicePort{
			svc("web", "http", "10.96.0.10", 3, local(2), func(sp *k8s.ServicePort) { sp.InternalPolicyLocal = true }),
			svc("remote", "http", "10.96.0.11", 1, func(sp *k8s.ServicePort) { sp.InternalPolicyLocal = true }),
		}, node: k8s.Node{Name: "node-1"}},
		{name: "service-cidrs", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}}},
		{name: "localhost-nodeports", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, nodePort(30080))},
			cfg: Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, LocalhostNodePorts: true}},
		{name: "ipv6", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080), dualStack, func(sp *k8s.ServicePort) {
			sp.AffinityTimeout = time.Minute
		})}, cfg: Config{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}}},
		{name: "topology-zone", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3, func(sp *k8s.ServicePort) {
			sp.TrafficDistribution = "PreferClose"
			for i := range sp.Endpoints {
				sp.Endpoints[i].Hints = hint(sp.Endpoints[i].Hints, []string{"zone-a", "zone-b", "zone-a"}[i], "")
			}
		})}, node: k8s.Node{Name: "node-1", Zone: "zone-a"}},
		{name: "topology-node", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3, func(sp *k8s.ServicePort) {
			// Node hints on every endpoint decide, with or without a
			// trafficDistribution, as in kube-proxy.
			for i := range sp.Endpoints {
				sp.Endpoints[i].Hints = hint(sp.Endpoints[i].Hints, "zone-a", "")
				sp.Endpoints[i].Hints = hint(sp.Endpoints[i].Hints, "", []string{"node-2", "node-1", "node-3"}[i])
			}
		})}, node: k8s.Node{Name: "node-1", Zone: "zone-a"}},
		{name: "terminating-fallback", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0, func(sp *k8s.ServicePort) {
			sp.Endpoints = []k8s.Endpoint{
				{Addr: netip.MustParseAddr("10.244.1.10"), Port: 8080, Serving: true, Terminating: true},
				{Addr: netip.MustParseAddr("10.244.1.11"), Port: 8080, Terminating: true},
			}
		})}},
	}
}

func TestCompileGolden(t *testing.T) {
	for _, tt := range goldenCases() {
		t.Run(tt.name, func(t *testing.T) {
			got := m.Render(tt.compile())
			golden := filepath.Join("testdata", tt.name+".nft")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden file (run go test ./proxier -update): %v", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("ruleset differs from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func TestCompileDeterministic(t *testing.T) {
	snap := &k8s.Snapshot{Services: []k8s.ServicePort{
		svc("a", "http", "10.96.0.10", 3, nodePort(30001)),
		svc("b", "http", "10.96.0.11", 3, nodePort(30002)),
		svc("c", "http", "10.96.0.12", 2),
	}}
	first := m.Render(Compile(snap, testConfig))
	for range 20 {
		if got := m.Render(Compile(snap, testConfig)); got != first {
			t.Fatalf("Compile is not deterministic:\n%s", cmp.Diff(first, got))
		}
	}
}

// TestServiceCIDRsFromSnapshot: the ranges of the cluster's ServiceCIDR
// objects act like --service-cidr, and a range in both counts once.
func TestServiceCIDRsFromSnapshot(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")
	services := []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)}
	flag := Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, ServiceCIDRs: []netip.Prefix{v4, v6}}
	want := m.Render(Compile(&k8s.Snapshot{Services: services}, flag))
	noFlag := flag
	noFlag.ServiceCIDRs = nil
	for name, got := range map[string]*m.Ruleset{
		"from the snapshot": Compile(&k8s.Snapshot{Services: services, ServiceCIDRs: []netip.Prefix{v4, v6}}, noFlag),
		"from both":         Compile(&k8s.Snapshot{Services: services, ServiceCIDRs: []netip.Prefix{v4}}, flag),
	} {
		if diff := cmp.Diff(want, m.Render(got)); diff != "" {
			t.Errorf("%s (-flag +got):\n%s", name, diff)
		}
	}
}

// hint returns h with its zones set to zone and its nodes to node, each when
// given.
func hint(h *k8s.Hints, zone, node string) *k8s.Hints {
	out := &k8s.Hints{}
	if h != nil {
		*out = *h
	}
	if zone != "" {
		out.Zones = []string{zone}
	}
	if node != "" {
		out.Nodes = []string{node}
	}
	return out
}

// TestRouteLocalnetOwned: the localnet guard's comment carries whether
// nftproxy turned route_localnet on, and only the guard does.
func TestRouteLocalnetOwned(t *testing.T) {
	for _, tt := range []struct {
		localhost, owned, want bool
	}{{true, true, true}, {true, false, false}, {false, true, false}} {
		cfg := Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, LocalhostNodePorts: tt.localhost, RouteLocalnetOwned: tt.owned}
		if got := RouteLocalnetOwned(Compile(&k8s.Snapshot{}, cfg)); got != tt.want {
			t.Errorf("localhost %v, owned %v: RouteLocalnetOwned %v, want %v", tt.localhost, tt.owned, got, tt.want)
		}
	}
	if RouteLocalnetOwned(nil) {
		t.Error("no table: owned")
	}
}
