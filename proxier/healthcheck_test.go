package proxier

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

func TestHealthCheckNodePort(t *testing.T) {
	ports := map[uint16]string{}
	hc := NewHealthChecks(zap.NewNop(), NewHealth(60e9), HealthCheckOptions{
		Listen: func(_ string, addr netip.AddrPort) (net.Listener, error) {
			l, err := net.Listen("tcp", "127.0.0.1:0") // the test can't pick the port
			if err == nil {
				ports[addr.Port()] = l.Addr().String()
			}
			return l, err
		}})
	defer hc.Close()
	web := svc("web", "http", "10.96.0.10", 2, local(1), func(sp *k8s.ServicePort) {
		sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, 32000
	})
	ask := func() (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://%s/healthz", ports[32000]))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != fmt.Sprint(body["localEndpoints"]) {
			t.Errorf("X-Load-Balancing-Endpoint-Weight %q, localEndpoints %v: want the same count, as kube-proxy sends", w, body["localEndpoints"])
		}
		return resp.StatusCode, body
	}

	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web}, Node: k8s.Node{Name: "node-1"}})
	if code, body := ask(); code != 200 || body["localEndpoints"].(float64) != 1 {
		t.Errorf("with a local endpoint: %d %v, want 200 and 1", code, body)
	}
	https := web
	https.Name.Port, https.Port = "https", 443 // same pod: still one local endpoint
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web, https}, Node: k8s.Node{Name: "node-1"}})
	if code, body := ask(); code != 200 || body["localEndpoints"].(float64) != 1 {
		t.Errorf("two ports of one local pod: %d %v, want 200 and 1", code, body)
	}
	terminating := web
	terminating.Endpoints = []k8s.Endpoint{{Addr: web.Endpoints[0].Addr, Port: 8080, Serving: true, Terminating: true, NodeName: "node-1"}}
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{terminating}, Node: k8s.Node{Name: "node-1"}})
	if code, _ := ask(); code != 503 {
		t.Errorf("only a terminating local pod: %d, want 503 so the load balancer drains the node", code)
	}
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web}, Node: k8s.Node{Name: "node-3"}})
	if code, body := ask(); code != 503 || body["localEndpoints"].(float64) != 0 {
		t.Errorf("without local endpoints: %d %v, want 503 and 0", code, body)
	}
	hc.Update(&k8s.Snapshot{})
	if _, err := http.Get(fmt.Sprintf("http://%s/healthz", ports[32000])); err == nil {
		t.Error("the server of a deleted service still answers")
	}
}

// TestListenAddrs: the healthCheckNodePort servers listen on the NodePort
// addresses of each family, as kube-proxy's do.
func TestListenAddrs(t *testing.T) {
	v4 := Config{Family: m.IPv4, NodePortPrimary: true}
	v6 := Config{Family: m.IPv6, NodePortPrimary: true}
	node := k8s.Node{Name: "n", Addrs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}}
	local := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("10.1.0.1"),
		netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("fd00::10"), netip.MustParseAddr("::1")}
	cidrs := func(f m.Family, ps ...string) Config {
		c := Config{Family: f}
		for _, p := range ps {
			c.NodePortAddresses = append(c.NodePortAddresses, netip.MustParsePrefix(p))
		}
		return c
	}
	tests := []struct {
		name string
		cfgs []Config
		node k8s.Node
		want []string
	}{
		{"primary of each family", []Config{v4, v6}, node, []string{"192.168.1.10", "fd00::10"}},
		{"bindAddress is the primary", []Config{{Family: m.IPv4, NodePortPrimary: true, BindAddress: netip.MustParseAddr("10.1.0.2")}}, node, []string{"10.1.0.2"}},
		{"a family without a primary: all of it", []Config{v4, v6}, k8s.Node{Name: "n", Addrs: node.Addrs[:1]}, []string{"192.168.1.10", "::"}},
		{"CIDRs: the local addresses in them", []Config{cidrs(m.IPv4, "10.1.0.0/16", "fd00::/64"), cidrs(m.IPv6, "10.1.0.0/16", "fd00::/64")}, node,
			[]string{"10.1.0.1", "10.1.0.2", "fd00::10"}},
		{"CIDRs of one family only", []Config{cidrs(m.IPv4, "192.168.0.0/16"), cidrs(m.IPv6, "192.168.0.0/16")}, node, []string{"192.168.1.10", "::"}},
		{"0.0.0.0/0", []Config{cidrs(m.IPv4, "0.0.0.0/0")}, node, []string{"0.0.0.0"}},
		{"no local address in the CIDRs", []Config{cidrs(m.IPv4, "172.16.0.0/12")}, node, []string{"0.0.0.0"}},
		{"no configuration", nil, node, []string{"invalid IP"}},
	}
	for _, tt := range tests {
		var got []string
		for _, a := range listenAddrs(tt.cfgs, &tt.node, local) {
			got = append(got, a.String())
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestHealthCheckBindFailure: a port that can't be bound on one of the
// addresses is logged and counted, none of its listeners is kept, and the
// next update tries again.
func TestHealthCheckBindFailure(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	busy := true
	var open []net.Listener
	hc := NewHealthChecks(zap.New(core), NewHealth(60e9), HealthCheckOptions{
		Configs:      []Config{{Family: m.IPv4, NodePortPrimary: true}, {Family: m.IPv6, NodePortPrimary: true}},
		BindFailures: failures,
		Listen: func(network string, addr netip.AddrPort) (net.Listener, error) {
			if busy && network == "tcp6" {
				return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				open = append(open, l)
			}
			return l, err
		}})
	defer hc.Close()
	snap := &k8s.Snapshot{Node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}},
		Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1, func(sp *k8s.ServicePort) {
			sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, 32000
		})}}
	hc.Update(snap)
	if got := testutil.ToFloat64(failures); got != 1 {
		t.Errorf("bind failures %v, want 1", got)
	}
	if logs.FilterMessage("Cannot serve health check node port").Len() != 1 {
		t.Errorf("logs %v, want the failure", logs.All())
	}
	// The IPv4 listener opened before the failure is closed again.
	if len(open) != 1 {
		t.Fatalf("%d listeners opened, want the IPv4 one", len(open))
	}
	if _, err := open[0].Accept(); err == nil {
		t.Error("the IPv4 listener stays open after the IPv6 one failed")
	}
	busy = false
	hc.Update(snap)
	if got := testutil.ToFloat64(failures); got != 1 || len(hc.servers) != 1 || len(hc.servers[32000].addrs) != 2 {
		t.Errorf("after the retry: failures %v, servers %v", got, hc.servers)
	}
}
