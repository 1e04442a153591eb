package proxier

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

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

var testConfig = Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}

func TestCompileGolden(t *testing.T) {
	tests := []struct {
		name     string
		services []k8s.ServicePort
		cfg      Config
	}{
		{name: "empty"},
		{name: "clusterip-1-endpoint", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)}},
		{name: "clusterip-2-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}},
		{name: "clusterip-5-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 5)}},
		{name: "nodeport", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2, nodePort(30080))}},
		{name: "no-endpoints", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0, nodePort(30080))}},
		{name: "udp", services: []k8s.ServicePort{svc("dns", "dns", "10.96.0.53", 2, udp)}},
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
		{name: "terminating-fallback", services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 0, func(sp *k8s.ServicePort) {
			sp.Endpoints = []k8s.Endpoint{
				{Addr: netip.MustParseAddr("10.244.1.10"), Port: 8080, Serving: true, Terminating: true},
				{Addr: netip.MustParseAddr("10.244.1.11"), Port: 8080, Terminating: true},
			}
		})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.ClusterCIDRs == nil && !cfg.MasqueradeAll {
				cfg = testConfig
			}
			got := m.Render(Compile(&k8s.Snapshot{Services: tt.services}, cfg))
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
