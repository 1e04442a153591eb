package e2e

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// TestLocalhostGuard is CVE-2020-8558: with route_localnet set (what
// --localhost-nodeports needs), a neighbour can send a frame addressed to
// the node's MAC with destination 127.0.0.1 and reach a listener bound to the
// node's loopback. The probe is a raw SYN from the client namespace; the
// answer is looked for on the client's interface.
//
// It runs the probe three ways: route_localnet alone (the probe must be
// answered, or the test could not see a guard work), nftproxy with
// --localhost-nodeports (dropped, while a localhost NodePort still works), and
// the reference kube-proxy in iptables mode (dropped: the answer nftproxy's
// guard must match).
func TestLocalhostGuard(t *testing.T) {
	if binary == "" {
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	const secretPort, nodePort = 7777, 30080
	const vip = "10.96.0.77"

	// setup builds a topology with a listener on the node's 127.0.0.1 and a
	// probe that sends the raw SYN to it from the client namespace.
	setup := func(t *testing.T) (*netns.Topology, func() uint8) {
		var mac net.HardwareAddr
		topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2l", Pods: 1})
		if _, err := topo.Pods[0].ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
		stop, err := topo.Node.ServeName("node-loopback", "tcp", secretPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		mac, err = topo.Node.MAC(netns.NodeUplink)
		if err != nil {
			t.Fatal(err)
		}
		// The attacker has talked to the node before, so the node knows its
		// MAC: an answer from 127.0.0.1 could not resolve it with ARP.
		clientMAC, err := topo.Client.MAC(netns.PodIface)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topo.Node.IP("neigh", "replace", topo.ClientAddr.String(), "lladdr", clientMAC.String(),
			"dev", netns.NodeUplink, "nud", "permanent"); err != nil {
			t.Fatal(err)
		}
		probe := func() uint8 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			flags, err := topo.Client.ProbeTCP(ctx, netns.RawFrame{Dev: netns.PodIface, DstMAC: mac,
				Src: topo.ClientAddr, Dst: netip.MustParseAddr("127.0.0.1"), SrcPort: 40000, DstPort: secretPort})
			if err != nil {
				t.Fatal(err)
			}
			return flags
		}
		return topo, probe
	}
	// localNodePort checks that the node's own 127.0.0.1:nodePort reaches the pod.
	localNodePort := func(t *testing.T, topo *netns.Topology) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), nodePort)
		clusterEventually(ctx, t, "127.0.0.1 NodePort", func() error {
			_, err := topo.Node.AskTCP(ctx, addr)
			return err
		})
	}

	t.Run("RouteLocalnetAloneIsExposed", func(t *testing.T) {
		topo, probe := setup(t)
		if err := topo.Node.Sysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
			t.Fatal(err)
		}
		if f := probe(); f&(netns.TCPSyn|netns.TCPAck) != netns.TCPSyn|netns.TCPAck {
			t.Fatalf("without a guard the raw SYN to 127.0.0.1:%d got flags %#x, want a SYN-ACK: the probe cannot show a guard working", secretPort, f)
		}
	})

	t.Run("NFTProxy", func(t *testing.T) {
		topo, probe := setup(t)
		manifest := svcSpec{name: "web", clusterIP: vip, port: 80, nodePort: nodePort, endpoints: []string{topo.Pods[0].Addr.String()}}.yaml()
		startOnManifest(t.Context(), t, topo, manifest, "--localhost-nodeports")
		if f := probe(); f != 0 {
			t.Errorf("with nftproxy --localhost-nodeports the raw SYN to 127.0.0.1:%d got flags %#x, want no answer", secretPort, f)
		}
		localNodePort(t, topo)
	})

	t.Run("KubeProxy", func(t *testing.T) {
		kubeProxyBinary(t)
		env := newClusterEnv(t)
		topo, probe := setup(t)
		env.createNodePortService(t.Context(), t, "e2e-localnet", "web", vip, nodePort, topo.Pods[0].Addr.String())
		// iptables mode sets route_localnet itself: localhostNodePorts is on
		// by default and the default nodePortAddresses include 127.0.0.1.
		startReferenceKubeProxy(t, env, topo.Node, "mode: iptables\nclusterCIDR: 10.244.0.0/16\n"+
			"conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n")
		localNodePort(t, topo)
		if f := probe(); f != 0 {
			t.Errorf("with kube-proxy the raw SYN to 127.0.0.1:%d got flags %#x, want no answer", secretPort, f)
		}
	})
}

// TestPrimaryNodePorts: by default NodePorts answer only on the node's
// primary address (kube-proxy's nftables mode default, "primary"): the node's
// address answers, a secondary address on the same interface refuses. The
// reference kube-proxy in nftables mode runs the same way and must agree.
func TestPrimaryNodePorts(t *testing.T) {
	if binary == "" {
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	const nodePort = 30080
	const vip = "10.96.0.78"
	secondary := netip.MustParseAddr("192.168.77.50")
	setup := func(t *testing.T) *netns.Topology {
		topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2p", Pods: 1})
		if _, err := topo.Pods[0].ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
		if _, err := topo.Node.IP("addr", "add", secondary.String()+"/24", "dev", netns.NodeUplink); err != nil {
			t.Fatal(err)
		}
		return topo
	}
	check := func(t *testing.T, topo *netns.Topology, who string) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		primary := netip.AddrPortFrom(topo.NodeAddr, nodePort)
		clusterEventually(ctx, t, who+": NodePort on the primary address", func() error {
			_, err := topo.Client.AskTCP(ctx, primary)
			return err
		})
		if got, err := topo.Client.AskTCP(ctx, netip.AddrPortFrom(secondary, nodePort)); !clusterRefused(err) {
			t.Errorf("%s: NodePort on the secondary address %s answered %q (error %v), want it refused", who, secondary, got, err)
		}
	}

	t.Run("NFTProxy", func(t *testing.T) {
		topo := setup(t)
		manifest := svcSpec{name: "web", clusterIP: vip, port: 80, nodePort: nodePort, endpoints: []string{topo.Pods[0].Addr.String()}}.yaml()
		startOnManifest(t.Context(), t, topo, manifest, "--node-ip", topo.NodeAddr.String())
		check(t, topo, "nftproxy")
	})

	t.Run("KubeProxy", func(t *testing.T) {
		kubeProxyBinary(t)
		env := newClusterEnv(t)
		topo := setup(t)
		env.createNodePortService(t.Context(), t, "e2e-primary", "web", vip, nodePort, topo.Pods[0].Addr.String())
		startReferenceKubeProxy(t, env, topo.Node, "mode: nftables\nclusterCIDR: 10.244.0.0/16\n"+
			"conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n")
		check(t, topo, "kube-proxy")
	})
}

// TestRouteLocalnetOwnership: --localhost-nodeports turns route_localnet on
// only after the sync that installed the localnet guard, a restart keeps
// knowing that nftproxy turned it on, and cleanup turns it off again; where
// it was on before nftproxy, cleanup leaves it on.
func TestRouteLocalnetOwnership(t *testing.T) {
	if binary == "" {
		netns.Require(t)
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	const key = "net/ipv4/conf/all/route_localnet"
	manifest := svcSpec{name: "web", clusterIP: "10.96.0.78", port: 80, nodePort: 30081, endpoints: []string{"10.244.1.10"}}.yaml()
	read := func(t *testing.T, topo *netns.Topology) string {
		out, err := topo.Node.Exec("cat", "/proc/sys/"+key)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	for _, tt := range []struct {
		name, before, afterCleanup string
	}{
		{"OffBefore", "0", "0"},
		{"OnBefore", "1", "1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2rl", Pods: 1})
			if err := topo.Node.Sysctl(key, tt.before); err != nil {
				t.Fatal(err)
			}
			for run := range 2 { // the second is a restart
				d := startOnManifest(t.Context(), t, topo, manifest, "--localhost-nodeports")
				if got := read(t, topo); got != "1" {
					t.Fatalf("run %d: route_localnet %s after the first sync, want 1", run, got)
				}
				log := d.Log()
				synced, set := strings.Index(log, SyncedLine), strings.Index(log, `"name":"`+key+`"`)
				if tt.before == "0" && run == 0 && (set < 0 || set < synced) {
					t.Errorf("route_localnet set at %d of the log, the first sync at %d: want it after the sync that installs the guard:\n%s", set, synced, log)
				}
				if err := d.Stop(); err != nil {
					t.Fatal(err)
				}
			}
			if out, err := topo.Node.Exec(binary, "cleanup"); err != nil {
				t.Fatalf("cleanup: %v\n%s", err, out)
			}
			if got := read(t, topo); got != tt.afterCleanup {
				t.Errorf("route_localnet %s after cleanup, want %s", got, tt.afterCleanup)
			}
		})
	}
}
