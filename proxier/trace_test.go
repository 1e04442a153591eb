package proxier

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// The node of these tests: 192.168.77.1 towards the clients (192.168.77.2 is
// one), 10.244.1.1 on the pod bridge, fd77::1 for IPv6, and loopback.
func traceNodeLocal(a netip.Addr) bool {
	switch a.String() {
	case "192.168.77.1", "10.244.1.1", "fd77::1", "::1":
		return true
	}
	return netip.MustParsePrefix("127.0.0.0/8").Contains(a)
}

const (
	podSrc     = "10.244.1.50"  // a pod on this node, not an endpoint
	outsideSrc = "192.168.77.2" // a client outside the cluster
)

// tracePkt is a TCP packet from src arriving at the node (prerouting).
func tracePkt(src, dst string, port uint16, mods ...func(*m.Packet)) m.Packet {
	p := m.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: 6,
		SrcPort: 41000, DstPort: port, Local: traceNodeLocal, Hook: m.HookPrerouting}
	for _, mod := range mods {
		mod(&p)
	}
	return p
}

// fromNode makes the packet one the node sends itself.
func fromNode(p *m.Packet)            { p.Hook = m.HookOutput }
func udpPkt(p *m.Packet)              { p.Proto = 17 }
func sctpPkt(p *m.Packet)             { p.Proto = 132 }
func iif(name string) func(*m.Packet) { return func(p *m.Packet) { p.Iif = name } }
func marked(mark uint32) func(*m.Packet) {
	return func(p *m.Packet) { p.Mark = mark }
}

func externalIP(ip string) func(*k8s.ServicePort) {
	return func(sp *k8s.ServicePort) { sp.ExternalIPs = append(sp.ExternalIPs, netip.MustParseAddr(ip)) }
}

// ipv6 turns a service built by svc into an IPv6 one.
func ipv6(sp *k8s.ServicePort) {
	sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00:96::10")}
	for i := range sp.Endpoints {
		sp.Endpoints[i].Addr = netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x00, 2: 0x02, 3: 0x44, 15: byte(0x10 + i)})
	}
}

func TestTraceCompiled(t *testing.T) {
	web2 := []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080))}
	web0 := []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0, nodePort(30080))}
	sctp2 := []k8s.ServicePort{svc("diameter", "diameter", "10.96.0.30", 2, nodePort(30868), sctp)}
	both := []string{"10.244.1.10:8080", "10.244.1.11:8080"}
	v6Config := Config{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}}

	tests := []struct {
		name     string
		services []k8s.ServicePort
		cfg      *Config // testConfig when nil
		p        m.Packet
		verdict  string
		reach    []string // endpoints reached
		// masqueraded are the endpoints whose branch is masqueraded.
		masqueraded []string
	}{
		{
			name:     "ClusterIP from a pod reaches every endpoint, source kept",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 80),
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "ClusterIP from outside the cluster CIDR is masqueraded",
			services: web2, p: tracePkt(outsideSrc, "10.96.0.10", 80),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "ClusterIP from the node itself is masqueraded",
			services: web2, p: tracePkt("192.168.77.1", "10.96.0.10", 80, fromNode),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "ClusterIP on an unknown port is refused (a port no service has)",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 81),
			verdict: m.VerdictReject,
		},
		{
			name:     "ClusterIP with the other protocol is refused (a port no service has)",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 80, udpPkt),
			verdict: m.VerdictReject,
		},
		{
			name:     "SCTP ClusterIP from a pod reaches every endpoint, source kept",
			services: sctp2, p: tracePkt(podSrc, "10.96.0.30", 3868, sctpPkt),
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "SCTP NodePort from outside reaches endpoints, masqueraded",
			services: sctp2, p: tracePkt(outsideSrc, "192.168.77.1", 30868, sctpPkt),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "TCP to an SCTP service port is refused (a port no service has)",
			services: sctp2, p: tracePkt(podSrc, "10.96.0.30", 3868),
			verdict: m.VerdictReject,
		},
		{
			name:     "NodePort on a node address from outside reaches endpoints, masqueraded",
			services: web2, p: tracePkt(outsideSrc, "192.168.77.1", 30080),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "NodePort on the node's bridge address from a pod",
			services: web2, p: tracePkt(podSrc, "10.244.1.1", 30080),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "NodePort from the node itself to its own address",
			services: web2, p: tracePkt("192.168.77.1", "192.168.77.1", 30080, fromNode),
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "NodePort on loopback does not match",
			services: web2, p: tracePkt("127.0.0.1", "127.0.0.1", 30080, fromNode),
			verdict: m.VerdictAccept,
		},
		{
			name:     "NodePort on an address that is not the node's does not match",
			services: web2, p: tracePkt(outsideSrc, "192.168.77.9", 30080),
			verdict: m.VerdictAccept,
		},
		{
			name:     "NodePort outside --nodeport-addresses does not match",
			services: web2, p: tracePkt(podSrc, "10.244.1.1", 30080),
			cfg: &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs,
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}},
			verdict: m.VerdictAccept,
		},
		{
			name:     "NodePort inside --nodeport-addresses matches",
			services: web2, p: tracePkt(outsideSrc, "192.168.77.1", 30080),
			cfg: &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs,
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}},
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "ClusterIP without endpoints is rejected",
			services: web0, p: tracePkt(podSrc, "10.96.0.10", 80),
			verdict: m.VerdictReject,
		},
		{
			name:     "ClusterIP without endpoints is rejected from the node too",
			services: web0, p: tracePkt("192.168.77.1", "10.96.0.10", 80, fromNode),
			verdict: m.VerdictReject,
		},
		{
			name:     "NodePort without endpoints is rejected",
			services: web0, p: tracePkt(outsideSrc, "192.168.77.1", 30080),
			verdict: m.VerdictReject,
		},
		{
			name:     "NodePort without endpoints on loopback is not rejected",
			services: web0, p: tracePkt("127.0.0.1", "127.0.0.1", 30080, fromNode),
			verdict: m.VerdictAccept,
		},
		{
			name:     "UDP ClusterIP reaches its endpoints",
			services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 2, udp)},
			p:        tracePkt(podSrc, "10.96.0.53", 53, udpPkt),
			verdict:  m.VerdictAccept, reach: both,
		},
		{
			name:     "UDP ClusterIP without endpoints is rejected",
			services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 0, udp)},
			p:        tracePkt(podSrc, "10.96.0.53", 53, udpPkt),
			verdict:  m.VerdictReject,
		},
		{
			name:     "TCP to a UDP service port is refused (a port no service has)",
			services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 2, udp)},
			p:        tracePkt(podSrc, "10.96.0.53", 53),
			verdict:  m.VerdictReject,
		},
		{
			name:     "hairpin: the only endpoint reaches itself, masqueraded",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)},
			p:        tracePkt("10.244.1.10", "10.96.0.10", 80),
			verdict:  m.VerdictAccept, reach: []string{"10.244.1.10:8080"}, masqueraded: []string{"10.244.1.10:8080"},
		},
		{
			name:     "hairpin: of two endpoints only the way back to itself is masqueraded",
			services: web2, p: tracePkt("10.244.1.11", "10.96.0.10", 80),
			verdict: m.VerdictAccept, reach: both, masqueraded: []string{"10.244.1.11:8080"},
		},
		{
			// kube-proxy v1.36 drops nothing for 0x8000 in any mode: the bit
			// is left to whoever else uses it.
			name:     "the 0x8000 mark is left alone",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 80, marked(0x8000)),
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "detect-local BridgeInterface: a pod on the bridge is not masqueraded",
			services: web2, p: tracePkt(outsideSrc, "10.96.0.10", 80, iif("br0")),
			cfg:     &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalBridgeInterface, Interface: "br0"}},
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "detect-local BridgeInterface: a pod address from elsewhere is masqueraded",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 80, iif("eth0")),
			cfg:     &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalBridgeInterface, Interface: "br0"}},
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "detect-local InterfaceNamePrefix: a pod's veth is local",
			services: web2, p: tracePkt(outsideSrc, "10.96.0.10", 80, iif("veth12ab")),
			cfg:     &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalInterfaceNamePrefix, Interface: "veth"}},
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "detect-local None: nothing is masqueraded for coming from outside",
			services: web2, p: tracePkt(outsideSrc, "10.96.0.10", 80),
			cfg:     &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, DetectLocal: DetectLocal{Mode: LocalNone}},
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "--masquerade-all masquerades pods too",
			services: web2, p: tracePkt(podSrc, "10.96.0.10", 80),
			cfg:     &Config{Family: m.IPv4, ClusterCIDRs: testConfig.ClusterCIDRs, MasqueradeAll: true},
			verdict: m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name:     "without a cluster CIDR nothing is masqueraded for ClusterIPs",
			services: web2, p: tracePkt(outsideSrc, "10.96.0.10", 80),
			cfg:     &Config{Family: m.IPv4},
			verdict: m.VerdictAccept, reach: both,
		},
		{
			name:     "external IP from a pod is masqueraded",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, externalIP("192.168.77.100"))},
			p:        tracePkt(podSrc, "192.168.77.100", 80),
			verdict:  m.VerdictAccept, reach: both, masqueraded: both,
		},
		{
			name: "IPv4 source ranges don't filter an IPv6 load balancer address, as in kube-proxy",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, ipv6, func(sp *k8s.ServicePort) {
				sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("fd00:200::10")}
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
			})},
			p:       tracePkt("fd77::2", "fd00:200::10", 80),
			cfg:     &v6Config,
			verdict: m.VerdictAccept, reach: []string{"[fd00:244::10]:8080", "[fd00:244::11]:8080"},
			masqueraded: []string{"[fd00:244::10]:8080", "[fd00:244::11]:8080"},
		},
		{
			name: "IPv6 source ranges filter an IPv6 load balancer address",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, ipv6, func(sp *k8s.ServicePort) {
				sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("fd00:200::10")}
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24"), netip.MustParsePrefix("fd99::/64")}
			})},
			p:       tracePkt("fd77::2", "fd00:200::10", 80),
			cfg:     &v6Config,
			verdict: m.VerdictDrop,
		},
		{
			name: "an IPv6 external IP of an IPv4-only service is left alone, as in kube-proxy",
			services: []k8s.ServicePort{svc("ssh", "ssh", "10.96.0.10", 1, externalIP("fd77::1"), func(sp *k8s.ServicePort) {
				sp.Port = 22
			})},
			p:       tracePkt("fd77::2", "fd77::1", 22),
			cfg:     &v6Config,
			verdict: m.VerdictAccept,
		},
		{
			name:     "IPv6 ClusterIP from a pod",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, ipv6)},
			p:        tracePkt("fd00:244::50", "fd00:96::10", 80),
			cfg:      &v6Config,
			verdict:  m.VerdictAccept, reach: []string{"[fd00:244::10]:8080", "[fd00:244::11]:8080"},
		},
		{
			name:     "IPv6 ClusterIP from outside",
			services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, ipv6)},
			p:        tracePkt("fd77::2", "fd00:96::10", 80),
			cfg:      &v6Config,
			verdict:  m.VerdictAccept, reach: []string{"[fd00:244::10]:8080", "[fd00:244::11]:8080"},
			masqueraded: []string{"[fd00:244::10]:8080", "[fd00:244::11]:8080"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			got := m.Trace(Compile(&k8s.Snapshot{Services: tt.services}, cfg), tt.p)
			explain := "\nsteps:\n" + strings.Join(got.Steps, "\n")
			if got.Verdict != tt.verdict {
				t.Errorf("verdict = %q, want %q%s", got.Verdict, tt.verdict, explain)
			}
			checkReached(t, got, tt.reach, tt.masqueraded)
			if got.Masquerade != (len(tt.masqueraded) > 0) {
				t.Errorf("Masquerade = %v, want %v%s", got.Masquerade, len(tt.masqueraded) > 0, explain)
			}
		})
	}
}

// TestTraceRejectKind checks how a service without endpoints answers: a TCP
// reset for TCP, an ICMP error for everything else.
func TestTraceRejectKind(t *testing.T) {
	tests := []struct {
		name     string
		services []k8s.ServicePort
		p        m.Packet
		want     string
	}{
		{name: "TCP", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0)},
			p: tracePkt(podSrc, "10.96.0.10", 80), want: "reject with tcp reset"},
		{name: "UDP", services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 0, udp)},
			p: tracePkt(podSrc, "10.96.0.53", 53, udpPkt), want: "reject"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := m.Trace(Compile(&k8s.Snapshot{Services: tt.services}, testConfig), tt.p)
			if len(got.Steps) < 2 {
				t.Fatalf("steps = %q, want a reject and a verdict", got.Steps)
			}
			last := got.Steps[len(got.Steps)-2] // before "verdict: reject"
			if _, rule, _ := strings.Cut(last, ": "); rule != tt.want {
				t.Errorf("rejecting step = %q, want the rule %q\nsteps:\n%s", last, tt.want, strings.Join(got.Steps, "\n"))
			}
		})
	}
}

func addrPorts(ss []string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddrPort(s)
	}
	return out
}

// checkReached compares the endpoints a traced packet reached, and those of
// them it reached masqueraded, with the wanted ones; a failure shows the steps.
func checkReached(t *testing.T, got m.Outcome, reach, masqueraded []string) {
	t.Helper()
	explain := "\nsteps:\n" + strings.Join(got.Steps, "\n")
	if diff := cmp.Diff(addrPorts(reach), got.Endpoints, cmpopts.EquateEmpty(),
		cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("endpoints reached differ (-want +got):\n%s%s", diff, explain)
	}
	var masq []netip.AddrPort
	for _, b := range got.Branches {
		if b.Masquerade {
			masq = append(masq, b.Endpoint)
		}
	}
	slices.SortFunc(masq, netip.AddrPort.Compare)
	if diff := cmp.Diff(addrPorts(masqueraded), masq, cmpopts.EquateEmpty(),
		cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("masqueraded endpoints differ (-want +got):\n%s%s", diff, explain)
	}
}

// TestTraceTopology checks which endpoints topology hints leave to a pod on
// node-1 in zone-a, whatever the service's trafficDistribution says.
func TestTraceTopology(t *testing.T) {
	node := k8s.Node{Name: "node-1", Zone: "zone-a"}
	type hints struct{ zone, node string } // "" for none
	tests := []struct {
		name         string
		distribution string
		hints        []hints // of endpoints 10.244.1.10, .11, .12
		reach        []string
	}{
		{name: "PreferClose keeps this zone", distribution: "PreferClose",
			hints: []hints{{zone: "zone-a"}, {zone: "zone-b"}, {zone: "zone-a"}},
			reach: []string{"10.244.1.10:8080", "10.244.1.12:8080"}},
		{name: "zone hints without trafficDistribution (topology-mode annotation)",
			hints: []hints{{zone: "zone-b"}, {zone: "zone-a"}, {zone: "zone-b"}},
			reach: []string{"10.244.1.11:8080"}},
		{name: "no hint for this zone keeps all", distribution: "PreferClose",
			hints: []hints{{zone: "zone-b"}, {zone: "zone-b"}, {zone: "zone-c"}},
			reach: []string{"10.244.1.10:8080", "10.244.1.11:8080", "10.244.1.12:8080"}},
		{name: "an endpoint without zone hints keeps all", distribution: "PreferClose",
			hints: []hints{{zone: "zone-a"}, {}, {zone: "zone-b"}},
			reach: []string{"10.244.1.10:8080", "10.244.1.11:8080", "10.244.1.12:8080"}},
		{name: "node hints on every endpoint keep this node", distribution: "PreferSameNode",
			hints: []hints{{"zone-a", "node-2"}, {"zone-a", "node-1"}, {"zone-b", "node-3"}},
			reach: []string{"10.244.1.11:8080"}},
		{name: "node hints on some endpoints only fall back to the zone", distribution: "PreferSameNode",
			hints: []hints{{"zone-a", "node-1"}, {zone: "zone-b"}, {zone: "zone-a"}},
			reach: []string{"10.244.1.10:8080", "10.244.1.12:8080"}},
		{name: "no node hint for this node falls back to the zone", distribution: "PreferSameNode",
			hints: []hints{{"zone-a", "node-2"}, {"zone-b", "node-3"}, {"zone-a", "node-4"}},
			reach: []string{"10.244.1.10:8080", "10.244.1.12:8080"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := svc("web", "http", "10.96.0.10", len(tt.hints), func(sp *k8s.ServicePort) {
				sp.TrafficDistribution = tt.distribution
				for i, h := range tt.hints {
					if h.zone != "" {
						sp.Endpoints[i].Hints = hint(sp.Endpoints[i].Hints, h.zone, "")
					}
					if h.node != "" {
						sp.Endpoints[i].Hints = hint(sp.Endpoints[i].Hints, "", h.node)
					}
				}
			})
			got := m.Trace(Compile(&k8s.Snapshot{Services: []k8s.ServicePort{sp}, Node: node}, testConfig),
				tracePkt(podSrc, "10.96.0.10", 80))
			if diff := cmp.Diff(addrPorts(tt.reach), got.Endpoints, cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("endpoints reached differ (-want +got):\n%s\nsteps:\n%s", diff, strings.Join(got.Steps, "\n"))
			}
		})
	}
}

// TestTraceExternalPolicyLocal checks eTP=Local on node-1: traffic from
// outside reaches only the local endpoints with its source kept (none:
// dropped), pods and the node itself every endpoint.
func TestTraceExternalPolicyLocal(t *testing.T) {
	all := []string{"10.244.1.10:8080", "10.244.1.11:8080", "10.244.1.12:8080"}
	etpLocal := func(sp *k8s.ServicePort) { sp.ExternalPolicyLocal = true }
	tests := []struct {
		name        string
		local       int // endpoints on node-1, of 3
		p           m.Packet
		verdict     string
		reach       []string
		masqueraded []string
	}{
		{name: "NodePort from outside reaches the local endpoint", local: 1,
			p: tracePkt(outsideSrc, "192.168.77.1", 30080), verdict: m.VerdictAccept, reach: all[:1]},
		{name: "NodePort from outside reaches both local endpoints", local: 2,
			p: tracePkt(outsideSrc, "192.168.77.1", 30080), verdict: m.VerdictAccept, reach: all[:2]},
		{name: "external IP from outside reaches the local endpoint", local: 1,
			p: tracePkt(outsideSrc, "192.168.77.100", 80), verdict: m.VerdictAccept, reach: all[:1]},
		{name: "NodePort from outside without local endpoints is dropped", local: 0,
			p: tracePkt(outsideSrc, "192.168.77.1", 30080), verdict: m.VerdictDrop},
		{name: "NodePort from a pod reaches every endpoint, source kept", local: 1,
			p: tracePkt(podSrc, "192.168.77.1", 30080), verdict: m.VerdictAccept, reach: all},
		{name: "NodePort from the node itself reaches every endpoint, masqueraded", local: 0,
			p: tracePkt("192.168.77.1", "192.168.77.1", 30080, fromNode), verdict: m.VerdictAccept, reach: all, masqueraded: all},
		{name: "ClusterIP from outside reaches every endpoint", local: 1,
			p: tracePkt(outsideSrc, "10.96.0.10", 80), verdict: m.VerdictAccept, reach: all, masqueraded: all},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := svc("web", "http", "10.96.0.10", 3, nodePort(30080), externalIP("192.168.77.100"), local(tt.local), etpLocal)
			got := m.Trace(Compile(&k8s.Snapshot{Services: []k8s.ServicePort{sp}, Node: k8s.Node{Name: "node-1"}}, testConfig), tt.p)
			explain := "\nsteps:\n" + strings.Join(got.Steps, "\n")
			if got.Verdict != tt.verdict {
				t.Errorf("verdict = %q, want %q%s", got.Verdict, tt.verdict, explain)
			}
			checkReached(t, got, tt.reach, tt.masqueraded)
		})
	}
}

// TestTraceAffinity checks a service with ClientIP affinity: a client the
// affinity map doesn't hold reaches every endpoint, and the connection is
// remembered after DNAT under the entry it used.
func TestTraceAffinity(t *testing.T) {
	affinity := func(sp *k8s.ServicePort) { sp.AffinityTimeout = time.Minute }
	all := []string{"10.244.1.10:8080", "10.244.1.11:8080"}
	for _, tt := range []struct {
		name        string
		p           m.Packet
		masqueraded []string
	}{
		{"ClusterIP from a pod", tracePkt(podSrc, "10.96.0.10", 80), nil},
		{"NodePort from outside", tracePkt(outsideSrc, "192.168.77.1", 30080), all},
		{"ClusterIP from the node", tracePkt("192.168.77.1", "10.96.0.10", 80, fromNode), all},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sp := svc("web", "http", "10.96.0.10", 2, nodePort(30080), affinity)
			got := m.Trace(Compile(&k8s.Snapshot{Services: []k8s.ServicePort{sp}}, testConfig), tt.p)
			explain := "\nsteps:\n" + strings.Join(got.Steps, "\n")
			checkReached(t, got, all, tt.masqueraded)
			remembered := 0
			for _, s := range got.Steps {
				if strings.Contains(s, "affinity-60: meta l4proto tcp update @affinity") && strings.Contains(s, "remembered in @affinity") {
					remembered++
				}
			}
			if remembered != len(all) {
				t.Errorf("%d branches remembered in @affinity, want %d%s", remembered, len(all), explain)
			}
		})
	}
}

// TestTraceSourceRanges: a load balancer address with source ranges lets
// only them through, and, like kube-proxy, the load balancer addresses
// themselves when one of the node's addresses is in a range (a node that
// holds the address connects from it); any other address of the node is
// not let through.
func TestTraceSourceRanges(t *testing.T) {
	const lb = "192.0.2.10"
	withRanges := func(ranges ...string) []k8s.ServicePort {
		return []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, func(sp *k8s.ServicePort) {
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(lb), netip.MustParseAddr("192.0.2.11")}
			for _, r := range ranges {
				sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
			}
		})}
	}
	clientOnly := withRanges("192.168.77.2/32", "10.244.1.48/29", "10.244.1.50/32") // none of the node's
	withNode := withRanges("192.168.77.0/30")
	tests := []struct {
		name     string
		services []k8s.ServicePort
		p        m.Packet
		verdict  string
	}{
		{"client in a range", clientOnly, tracePkt(outsideSrc, lb, 80), m.VerdictAccept},
		{"pod in a range nested in another", clientOnly, tracePkt(podSrc, lb, 80), m.VerdictAccept},
		{"client outside the ranges", clientOnly, tracePkt("192.168.77.5", lb, 80), m.VerdictDrop},
		{"another port is not guarded", clientOnly, tracePkt("192.168.77.5", lb, 81), m.VerdictAccept},
		{"the node, none of its addresses in a range, from the address", clientOnly, tracePkt(lb, lb, 80, fromNode), m.VerdictDrop},
		{"the node, its address in a range, from the address", withNode, tracePkt(lb, lb, 80, fromNode), m.VerdictAccept},
		{"the node, its address in a range, from the other address", withNode, tracePkt("192.0.2.11", lb, 80, fromNode), m.VerdictAccept},
		{"the node from its address in the range", withNode, tracePkt("192.168.77.1", lb, 80, fromNode), m.VerdictAccept},
		{"the node from its bridge address, outside the ranges", withNode, tracePkt("10.244.1.1", lb, 80, fromNode), m.VerdictDrop},
	}
	node := k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("10.244.1.1")}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := m.Trace(Compile(&k8s.Snapshot{Services: tt.services, Node: node}, testConfig), tt.p)
			if got.Verdict != tt.verdict {
				t.Errorf("verdict %s, want %s\n%s", got.Verdict, tt.verdict, strings.Join(got.Steps, "\n"))
			}
		})
	}
}
