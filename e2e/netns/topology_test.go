package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const namePort = 8080

func TestTopologyRouting(t *testing.T) {
	topo := NewTopology(t, TopologyOptions{Prefix: "nptopo", InClusterClient: true})
	if len(topo.Pods) != 3 {
		t.Fatalf("got %d pods, want 3", len(topo.Pods))
	}
	if topo.BridgeNFErr != nil {
		t.Errorf("bridge netfilter: %v", topo.BridgeNFErr)
	}
	for _, p := range topo.Pods {
		for _, proto := range []string{"TCP", "udp"} {
			if _, err := p.ServeName(proto, namePort); err != nil {
				t.Fatal(err)
			}
		}
	}
	p0, p1 := topo.Pods[0], topo.Pods[1]

	type ask struct {
		name  string
		from  *NS
		proto string
		to    netip.Addr
		want  string
	}
	var cases []ask
	for _, p := range topo.Pods {
		for _, proto := range []string{"tcp", "udp"} {
			cases = append(cases,
				ask{"client to " + p.Name + " v4", topo.Client, proto, p.Addr, p.Name},
				ask{"client to " + p.Name + " v6", topo.Client, proto, p.Addr6, p.Name})
		}
	}
	for _, proto := range []string{"tcp", "udp"} {
		cases = append(cases,
			ask{"pod to pod v4", p0.NS, proto, p1.Addr, p1.Name},
			ask{"pod to pod v6", p0.NS, proto, p1.Addr6, p1.Name},
			ask{"pod to itself v4", p0.NS, proto, p0.Addr, p0.Name},
			ask{"in-cluster client to pod v4", topo.InClusterClient.NS, proto, p1.Addr, p1.Name},
			ask{"in-cluster client to pod v6", topo.InClusterClient.NS, proto, p1.Addr6, p1.Name},
			ask{"node to pod v4", topo.Node, proto, p0.Addr, p0.Name},
			ask{"node to pod v6", topo.Node, proto, p0.Addr6, p0.Name})
	}
	for _, c := range cases {
		t.Run(c.name+" "+c.proto, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			to := netip.AddrPortFrom(c.to, namePort)
			var got string
			var err error
			if c.proto == "tcp" {
				got, err = c.from.AskTCP(ctx, to)
			} else {
				got, err = c.from.AskUDP(ctx, netip.AddrPort{}, to)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("answer %q, want %q", got, c.want)
			}
		})
	}
}

func TestTopologyRefusedAndSessions(t *testing.T) {
	topo := NewTopology(t, TopologyOptions{Prefix: "npref", Pods: 1})
	p := topo.Pods[0]
	stop, err := p.ServeName("tcp", namePort)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	for _, to := range []netip.Addr{p.Addr, p.Addr6} {
		closed := netip.AddrPortFrom(to, namePort+1)
		start := time.Now()
		if _, err := topo.Client.AskTCP(ctx, closed); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("TCP to closed port %s: %v, want ECONNREFUSED", closed, err)
		}
		if _, err := topo.Client.AskUDP(ctx, netip.AddrPort{}, closed); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to closed port %s: %v, want ECONNREFUSED", closed, err)
		}
		if d := time.Since(start); d > DefaultAskTimeout/2 {
			t.Errorf("refusals took %v", d)
		}
	}

	// A fixed source address and port, and a long-lived connection.
	local := netip.AddrPortFrom(ClientAddr, 40000)
	s, err := topo.Client.ConnectTCP(ctx, local, netip.AddrPortFrom(p.Addr, namePort))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Name != p.Name || s.Conn.LocalAddr().String() != local.String() {
		t.Errorf("session %q from %v, want %q from %v", s.Name, s.Conn.LocalAddr(), p.Name, local)
	}
	for i := range 3 {
		msg := fmt.Sprintf("ping %d", i)
		if got, err := s.Echo(ctx, msg); err != nil || got != msg {
			t.Errorf("echo %q = %q, %v", msg, got, err)
		}
	}
	if peer, err := s.Peer(ctx); err != nil || peer != local {
		t.Errorf("TCP peer = %v, %v; want %v", peer, err, local)
	}
	if _, err := p.ServeName("udp", namePort); err != nil {
		t.Fatal(err)
	}
	for _, local := range []netip.AddrPort{netip.AddrPortFrom(ClientAddr, 40001), netip.AddrPortFrom(ClientAddr6, 40001)} {
		to := netip.AddrPortFrom(p.Addr, namePort)
		if local.Addr().Is6() {
			to = netip.AddrPortFrom(p.Addr6, namePort)
		}
		if peer, err := topo.Client.AskUDPPeer(ctx, local, to); err != nil || peer != local {
			t.Errorf("UDP peer = %v, %v; want %v", peer, err, local)
		}
	}
	// Stopping the server ends open connections too.
	stop()
	if _, err := s.Echo(ctx, "after stop"); err == nil || IsTimeout(err) {
		t.Errorf("echo after stop: %v, want a closed connection", err)
	}

	// A silent drop is a timeout, not a refusal: nothing answers on the
	// client network except the node.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = topo.Client.AskUDP(short, netip.AddrPort{}, netip.AddrPortFrom(netip.MustParseAddr("192.168.77.200"), namePort))
	if !IsTimeout(err) && !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("UDP to absent host: %v, want timeout or unreachable", err)
	}
}

func TestTopologyCloseLeavesNothing(t *testing.T) {
	Require(t)
	topo, err := BuildTopology(TopologyOptions{Prefix: "npclose", Pods: 2, InClusterClient: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range []*NS{topo.Client, topo.Node, topo.Pods[0].NS, topo.Pods[1].NS, topo.InClusterClient.NS} {
		names = append(names, n.Name())
	}
	if _, err := topo.Pods[0].ServeName("tcp", namePort); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && slices.Contains(names, f[0]) {
			t.Errorf("namespace %s left after Close", f[0])
		}
	}
}

func TestBuildTopologyRejectsPodCount(t *testing.T) {
	if _, err := BuildTopology(TopologyOptions{Pods: maxPods + 1}); err == nil {
		t.Error("no error for too many pods")
	}
}

// TestTopologyServiceNAT checks the two properties service scenarios rely on,
// with a minimal DNAT ruleset in the node namespace: a pod reaching itself
// through a VIP (hairpin on the bridge port), and a pod reaching another pod
// on the same bridge through a VIP (bridge netfilter un-NATs the reply).
func TestTopologyServiceNAT(t *testing.T) {
	topo := NewTopology(t, TopologyOptions{Prefix: "npnat", Pods: 2})
	if topo.BridgeNFErr != nil {
		t.Skipf("bridge netfilter unavailable: %v", topo.BridgeNFErr)
	}
	for _, p := range topo.Pods {
		if _, err := p.ServeName("tcp", namePort); err != nil {
			t.Fatal(err)
		}
	}
	p0, p1 := topo.Pods[0], topo.Pods[1]
	for _, key := range []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables", "net/ipv4/ip_forward"} {
		var got []byte
		if err := topo.Node.Do(func() error {
			var err error
			got, err = os.ReadFile("/proc/sys/" + key)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(got)) != "1" {
			t.Errorf("node %s = %q, want 1", key, got)
		}
	}
	if out, err := topo.Node.Exec("cat", "/sys/class/net/vethp0/brport/hairpin_mode"); err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("hairpin_mode of vethp0 = %q, %v; want 1", out, err)
	}

	vip := netip.MustParseAddr("10.96.0.10")
	ruleset := fmt.Sprintf(`table ip nptest {
	chain pre {
		type nat hook prerouting priority -100;
		ip daddr %s tcp dport 80 dnat to %s:%d
	}
	chain post {
		type nat hook postrouting priority 100;
		ip saddr %s ip daddr %s masquerade
	}
}
`, vip, p0.Addr, namePort, p0.Addr, p0.Addr)
	if _, err := topo.Node.Exec("sh", "-c", "printf '%s' \"$0\" | nft -f -", ruleset); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, from := range []*Pod{p0, p1} {
		got, err := from.NS.AskTCP(ctx, netip.AddrPortFrom(vip, 80))
		if err != nil || got != p0.Name {
			t.Errorf("%s to VIP: %q, %v; want %q", from.Name, got, err, p0.Name)
		}
	}
	if got, err := topo.Client.AskTCP(ctx, netip.AddrPortFrom(vip, 80)); err != nil || got != p0.Name {
		t.Errorf("client to VIP: %q, %v; want %q", got, err, p0.Name)
	}
}
