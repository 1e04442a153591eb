package proxier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// Real packets through the shared endpoint map: a client namespace connects
// to a ClusterIP whose 1,000 endpoints are addresses of one pod namespace,
// where one server answers on all of them with the address it was reached
// at, then echoes.

const (
	wideEndpoints = 1000
	widePort      = 8080
)

var wideVIP = netip.MustParseAddr("10.96.0.10")

// wideAddr is endpoint i's address: 10.244.4.1 onwards, in ranges routed to
// the pod, skipping .0 and .255.
func wideAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(4 + i/250), byte(1 + i%250)})
}

// wideSnapshot is the service with the endpoints of the given indexes.
func wideSnapshot(idx []int) *k8s.Snapshot {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: "wide", Port: "http", Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{wideVIP},
		Port:       80,
	}
	for _, i := range idx {
		sp.Endpoints = append(sp.Endpoints, k8s.Endpoint{Addr: wideAddr(i), Port: widePort, Ready: true, Serving: true})
	}
	return &k8s.Snapshot{Services: []k8s.ServicePort{sp}}
}

// wideTopology builds client, node and one pod holding wideEndpoints+1
// addresses (one spare for a replacement), serving on all of them.
func wideTopology(t *testing.T) (*netns.Topology, *nftnl.Conn) {
	t.Helper()
	topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "pxw", Pods: 1})
	pod := topo.Pods[0]
	var cmds []string
	for i := range wideEndpoints + 1 {
		cmds = append(cmds, fmt.Sprintf("addr add %s/32 dev %s", wideAddr(i), netns.PodIface))
	}
	if err := pod.NS.IPBatch(cmds...); err != nil {
		t.Fatal(err)
	}
	// 10.244.4.1 to 10.244.8.1: the endpoints and the spare.
	if err := topo.Node.IPBatch(
		fmt.Sprintf("route add 10.244.4.0/22 via %s dev %s", pod.Addr, netns.BridgeName),
		fmt.Sprintf("route add 10.244.8.0/24 via %s dev %s", pod.Addr, netns.BridgeName)); err != nil {
		t.Fatal(err)
	}
	l, err := pod.NS.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", widePort))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { serveWide(c) })
		}
	})
	conn, err := nftnl.Dial(topo.Node.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return topo, conn
}

// serveWide answers with the address the connection reached, then echoes
// lines until the client closes.
func serveWide(c net.Conn) {
	defer func() { _ = c.Close() }()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if _, err := fmt.Fprintf(c, "%s\n", local); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

// wideConn is a client connection to the service and the endpoint it reached.
type wideConn struct {
	c  net.Conn
	r  *bufio.Reader
	ep netip.Addr
}

func dialWide(ctx context.Context, client *netns.NS) (*wideConn, error) {
	c, err := client.Dial(ctx, "tcp4", netip.AddrPortFrom(wideVIP, 80).String())
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	w := &wideConn{c: c, r: bufio.NewReader(c)}
	line, err := w.r.ReadString('\n')
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("read endpoint: %w", err)
	}
	if w.ep, err = netip.ParseAddr(strings.TrimSpace(line)); err != nil {
		_ = c.Close()
		return nil, err
	}
	return w, nil
}

// echo sends a line and expects it back.
func (w *wideConn) echo(msg string) error {
	_ = w.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(w.c, "%s\n", msg); err != nil {
		return err
	}
	got, err := w.r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("echo: got %q, want %q", got, msg)
	}
	return nil
}

// chiSquareCritical approximates the upper critical value of the chi-square
// distribution with df degrees of freedom at z standard deviations
// (Wilson–Hilferty).
func chiSquareCritical(df, z float64) float64 {
	a := 2 / (9 * df)
	return df * math.Pow(1-a+z*math.Sqrt(a), 3)
}

// TestWideServiceSpreadsAndKeepsConnections: new connections to a service
// with 1,000 endpoints spread uniformly over them (chi-square at about
// p = 3e-7, so the test does not flake), and replacing one endpoint over
// netlink leaves established connections to the others working.
func TestWideServiceSpreadsAndKeepsConnections(t *testing.T) {
	// The wide endpoints map and the hairpin set declared with a size, as
	// a large cluster's are: packets through the kernel's fixed-size hash.
	defer func(v int) { sizedFrom = v }(sizedFrom)
	sizedFrom = wideEndpoints / 2
	topo, conn := wideTopology(t)
	idx := make([]int, wideEndpoints)
	for i := range idx {
		idx[i] = i
	}
	snap := wideSnapshot(idx)
	cfg := Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netns.ClusterCIDR}}
	state, rs := newIncremental(snap, cfg, nil)
	if state.sizes[state.c.wideEndpoints] == 0 || state.sizes[state.c.hairpin] == 0 {
		t.Fatalf("sizes %v: the wide endpoints map and the hairpin set should have one", state.sizes)
	}
	if _, err := nftnl.Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Spread: 5 connections per endpoint expected.
	const n = 5 * wideEndpoints
	counts := map[netip.Addr]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			w, err := dialWide(ctx, topo.Client)
			if err != nil {
				errs <- err
				return
			}
			_ = w.c.Close()
			mu.Lock()
			counts[w.ep]++
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("connect: %v", err)
	}
	want := map[netip.Addr]bool{}
	for _, i := range idx {
		want[wideAddr(i)] = true
	}
	expected := float64(n) / wideEndpoints
	chi2 := 0.0
	for _, i := range idx {
		d := float64(counts[wideAddr(i)]) - expected
		chi2 += d * d / expected
	}
	for a := range counts {
		if !want[a] {
			t.Errorf("a connection reached %s, not an endpoint", a)
		}
	}
	crit := chiSquareCritical(wideEndpoints-1, 5)
	t.Logf("%d connections reached %d of %d endpoints; chi-square %.1f (df %d, critical %.1f)", n, len(counts), wideEndpoints, chi2, wideEndpoints-1, crit)
	if chi2 > crit {
		t.Errorf("chi-square %.1f above %.1f: connections are not spread uniformly", chi2, crit)
	}

	// Established connections survive a replacement of another endpoint.
	var conns []*wideConn
	defer func() {
		for _, w := range conns {
			_ = w.c.Close()
		}
	}()
	for len(conns) < 40 {
		w, err := dialWide(ctx, topo.Client)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, w)
	}
	gone := conns[0].ep
	next := make([]int, 0, wideEndpoints)
	for _, i := range idx {
		if wideAddr(i) != gone {
			next = append(next, i)
		}
	}
	next = append(next, wideEndpoints) // the spare address
	nextSnap := wideSnapshot(next)
	changes, ok := updateFrom(t, state, snap, nextSnap)
	if !ok {
		t.Fatal("update refused")
	}
	stats, err := nftnl.ApplyChanges(conn, m.IPv4, TableName, &changes)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replaced %s: %d elements in %d messages", gone, stats.Elements, stats.Messages)
	if stats.Elements > 4 {
		t.Errorf("replacing one endpoint sent %d elements, want at most 4", stats.Elements)
	}
	for i, w := range conns {
		if w.ep == gone {
			continue
		}
		if err := w.echo(fmt.Sprintf("after the change %d", i)); err != nil {
			t.Errorf("connection %d to %s: %v", i, w.ep, err)
		}
	}
	// New connections reach the new endpoint set only (the spare included:
	// with 200 tries, about one run in five reaches it).
	for range 200 {
		w, err := dialWide(ctx, topo.Client)
		if err != nil {
			t.Fatal(err)
		}
		_ = w.c.Close()
		if w.ep == gone {
			t.Fatalf("a new connection reached the removed endpoint %s", gone)
		}
	}
	if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}
