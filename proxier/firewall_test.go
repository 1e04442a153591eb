package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// Two load balancers with different source ranges in the shared firewall
// sets: 192.0.2.10 allows the client's first address, 192.0.2.20 its
// second.
var (
	fwLBA, fwLBB  = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.20")
	fwFirst       = netns.ClientAddr                    // 192.168.77.2
	fwSecond      = netip.MustParseAddr("192.168.77.3") // added to the client
	fwFirstRange  = netip.PrefixFrom(fwFirst, 32)
	fwSecondRange = netip.MustParsePrefix("192.168.77.3/32")
	fwBothRange   = netip.MustParsePrefix("192.168.77.2/31") // not the node's .1
	fwClusterIPA  = netip.MustParseAddr("10.96.0.10")
	fwClusterIPB  = netip.MustParseAddr("10.96.0.20")
)

// firewallSnapshot is the two services, each with its own ranges, their
// endpoint the pod.
func firewallSnapshot(pod netip.Addr, rangesA, rangesB []netip.Prefix) *k8s.Snapshot {
	mk := func(name string, clusterIP, lb netip.Addr, ranges []netip.Prefix) k8s.ServicePort {
		return k8s.ServicePort{
			Name:                     k8s.ServicePortName{Namespace: "default", Name: name, Port: "http", Protocol: k8s.TCP},
			ClusterIPs:               []netip.Addr{clusterIP},
			Port:                     80,
			LoadBalancerIPs:          []netip.Addr{lb},
			LoadBalancerSourceRanges: ranges,
			Endpoints:                []k8s.Endpoint{{Addr: pod, Port: 8080, Ready: true, Serving: true}},
		}
	}
	return &k8s.Snapshot{
		Node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netns.NodeAddr}},
		Services: []k8s.ServicePort{
			mk("a", fwClusterIPA, fwLBA, rangesA),
			mk("b", fwClusterIPB, fwLBB, rangesB),
		},
	}
}

// TestFirewallRealPackets sends real connections from an allowed and a
// refused source to each of two load balancers whose source ranges differ,
// then changes one service's ranges incrementally: only its elements go,
// and the other keeps filtering as before.
func TestFirewallRealPackets(t *testing.T) {
	topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "pxfw", Pods: 1})
	pod := topo.Pods[0]
	if _, err := pod.ServeName("tcp", 8080); err != nil {
		t.Fatal(err)
	}
	if err := topo.Client.IPBatch("addr add " + fwSecond.String() + "/32 dev " + netns.PodIface); err != nil {
		t.Fatal(err)
	}
	conn, err := nftnl.Dial(topo.Node.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	cfg := Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netns.ClusterCIDR}}
	snap := firewallSnapshot(pod.Addr, []netip.Prefix{fwFirstRange}, []netip.Prefix{fwSecondRange})
	state, rs := newIncremental(snap, cfg, nil)
	if _, err := nftnl.Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	type probe struct {
		from, lb netip.Addr
		allowed  bool
	}
	check := func(step string, probes []probe) {
		t.Helper()
		for _, p := range probes {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			name, err := topo.Client.AskTCPFrom(ctx, netip.AddrPortFrom(p.from, 0), netip.AddrPortFrom(p.lb, 80))
			cancel()
			switch {
			case p.allowed && (err != nil || name != pod.Name):
				t.Errorf("%s: %s to %s: %q, %v; want an answer from %s", step, p.from, p.lb, name, err, pod.Name)
			case !p.allowed && err == nil:
				t.Errorf("%s: %s to %s answered %q; want it dropped", step, p.from, p.lb, name)
			}
		}
	}
	check("first ranges", []probe{
		{fwFirst, fwLBA, true}, {fwSecond, fwLBA, false},
		{fwFirst, fwLBB, false}, {fwSecond, fwLBB, true},
	})

	// a's ranges widen to hold both sources; b's stay.
	next := firewallSnapshot(pod.Addr, []netip.Prefix{fwBothRange}, []netip.Prefix{fwSecondRange})
	changes, ok := updateFrom(t, state, snap, next)
	if !ok {
		t.Fatal("update refused")
	}
	if len(changes.AddChains)+len(changes.DelChains)+len(changes.RewriteChains)+len(changes.AddSets)+len(changes.DelSets) > 0 {
		t.Errorf("a change of ranges touches chains or sets: %+v", changes)
	}
	var sent []string
	for _, list := range [][]m.SetElements{changes.DelElements, changes.AddElements} {
		for _, se := range list {
			if se.Set != setFirewallAllow {
				t.Errorf("a change of ranges changes set %s", se.Set)
			}
			for _, e := range se.Elements {
				if e.Key[0].Addr != fwLBA {
					t.Errorf("a change of a's ranges sends an element of another address: %v", e)
				}
				end := e.KeyEnd
				if end == nil {
					end = e.Key
				}
				sent = append(sent, m.RenderRange(se.Key, e.Key, end))
			}
		}
	}
	if len(sent) != 2 {
		t.Errorf("sent %q, want a's old range deleted and its new one added", sent)
	}
	if _, err := nftnl.ApplyChanges(conn, m.IPv4, TableName, &changes); err != nil {
		t.Fatal(err)
	}
	check("a widened", []probe{
		{fwFirst, fwLBA, true}, {fwSecond, fwLBA, true},
		{fwFirst, fwLBB, false}, {fwSecond, fwLBB, true},
	})
}

// BenchmarkSourceRangesChange: n load balancers with two source ranges
// each, loaded over netlink in a namespace; each iteration changes one
// service's ranges and applies the delta. It prints the ruleset's chains,
// sets and maps (fixed) and what one change sends (its service's elements
// only):
//
//	go test -run - -bench SourceRanges ./proxier/
func BenchmarkSourceRangesChange(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			snap := &k8s.Snapshot{Node: k8s.Node{Name: "node-1", Addrs: []netip.Addr{netns.NodeAddr}}}
			for i := range n {
				sp := svc(fmt.Sprintf("lb-%d", i), "http", fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), 2)
				sp.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 18, byte(i / 250), byte(1 + i%250)})}
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"),
					netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, byte(i / 250), byte(i % 250)}), 32)}
				snap.Services = append(snap.Services, sp)
			}
			ns := netns.New(b, "pfb")
			conn, err := nftnl.Dial(ns.Fd())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			state, rs := newIncremental(snap, testConfig, nil)
			start := time.Now()
			if _, err := nftnl.Apply(conn, rs); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d load balancers: %d chains, %d sets and maps, full apply %v", n, len(rs.Chains), len(rs.Sets), time.Since(start).Round(time.Millisecond))
			// The service port in its two versions, swapped each iteration:
			// the update and its apply alone are timed.
			versions := [2]k8s.ServicePort{snap.Services[n/2], snap.Services[n/2]}
			versions[1].LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25")}
			var last m.Stats
			b.ResetTimer()
			for i := range b.N {
				from, to := &versions[i%2], &versions[(i+1)%2]
				changes, ok := state.update(snap.Node, nil, []portChange{{old: from, new: to}})
				if !ok {
					b.Fatal("update refused")
				}
				if last, err = nftnl.ApplyChanges(conn, m.IPv4, TableName, &changes); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.Logf("one service's ranges changed: %d elements, %d chains, %d messages", last.Elements, last.Chains, last.Messages)
		})
	}
}
