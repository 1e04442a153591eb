package netns

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// The fabric routes every pod CIDR to its node: pods on different nodes
// reach each other, the client and the load-balancer namespace reach pods
// and nodes, and everything reaches the fabric's own address.
func TestClusterTopologyRoutes(t *testing.T) {
	c := NewCluster(t, ClusterOptions{Prefix: "npkt", Nodes: 3, PodsPerNode: 2})
	for _, p := range c.Pods() {
		if _, err := p.ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Fabric.Listen("tcp", netip.AddrPortFrom(FabricAddr, 6443).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("fabric\n"))
			conn.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	from := []*NS{c.Client, c.LoadBalancer, c.Nodes[0].NS, c.Nodes[0].Pods[0].NS, c.Nodes[2].NS}
	for _, ns := range from {
		for _, p := range []*Pod{c.Nodes[1].Pods[1], c.Nodes[2].Pods[0], c.Nodes[0].Pods[1]} {
			if got, err := ns.AskTCP(ctx, netip.AddrPortFrom(p.Addr, 8080)); err != nil || got != p.Name {
				t.Errorf("from %s to %s: %q, %v", ns, p.Name, got, err)
			}
		}
		if got, err := ns.AskTCP(ctx, netip.AddrPortFrom(FabricAddr, 6443)); err != nil || got != "fabric" {
			t.Errorf("from %s to the fabric: %q, %v", ns, got, err)
		}
	}
	// No route leaves the fabric: an address outside the cluster is unreachable.
	if _, err := c.Nodes[0].NS.AskTCP(ctx, netip.MustParseAddrPort("192.0.2.1:80")); err == nil || IsTimeout(err) {
		t.Errorf("to an outside address: %v, want unreachable at once", err)
	}
	if len(c.Namespaces()) != 3+3*3 {
		t.Errorf("%d namespaces, want 12", len(c.Namespaces()))
	}
}
