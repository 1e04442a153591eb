package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Backend is one node behind a LoadBalancer: where connections go (the
// node's address and the service's NodePort) and the URL its health is
// read from (the service's healthCheckNodePort for externalTrafficPolicy
// Local, nftproxy's /healthz on port 10256 otherwise, as KEP-3836 has cloud
// load balancers do).
type Backend struct {
	Node   string
	Addr   netip.AddrPort
	Health string
}

// LoadBalancer is a user-space TCP balancer in the load-balancer namespace,
// standing in for a cloud load balancer in front of a Service of type
// LoadBalancer: it listens on the load balancer's address, sends each new
// connection to the next healthy node in turn, and checks every node's
// health URL every interval: a node that does not answer 200 gets no new
// connection until it does again. Connections already open stay where
// they are.
type LoadBalancer struct {
	ns       *netns.NS
	l        net.Listener
	backends []Backend
	stop     context.CancelFunc
	wg       sync.WaitGroup

	mu      sync.Mutex
	healthy map[string]bool
	next    int
	sent    map[string]int // connections per node
	failed  int            // connections closed without a backend
	conns   map[net.Conn]struct{}
	closed  bool
	checked chan struct{} // closed after the first round of health checks
}

// StartLoadBalancer listens on netns.LoadBalancerIP:port in the cluster's
// load-balancer namespace; Close (or the cluster's) stops it.
func (c *Cluster) StartLoadBalancer(port uint16, backends []Backend, interval time.Duration) (*LoadBalancer, error) {
	ns := c.Topo.LoadBalancer
	l, err := ns.Listen("tcp", netip.AddrPortFrom(netns.LoadBalancerIP, port).String())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	lb := &LoadBalancer{ns: ns, l: l, backends: backends, stop: cancel, healthy: map[string]bool{},
		sent: map[string]int{}, conns: map[net.Conn]struct{}{}, checked: make(chan struct{})}
	lb.wg.Go(func() { lb.checkLoop(ctx, interval) })
	lb.wg.Go(lb.acceptLoop)
	c.mu.Lock()
	c.lbs = append(c.lbs, lb)
	c.mu.Unlock()
	select {
	case <-lb.checked:
	case <-time.After(5 * time.Second):
	}
	return lb, nil
}

// Addr is the address clients connect to.
func (lb *LoadBalancer) Addr() netip.AddrPort {
	return netip.MustParseAddrPort(lb.l.Addr().String())
}

func (lb *LoadBalancer) checkLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	first := true
	for {
		var wg sync.WaitGroup
		for _, b := range lb.backends {
			wg.Go(func() {
				code, _, err := lb.ns.Get(ctx, b.Health)
				lb.mu.Lock()
				lb.healthy[b.Node] = err == nil && code == 200
				lb.mu.Unlock()
			})
		}
		wg.Wait()
		if first {
			close(lb.checked)
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Healthy lists the nodes the balancer sends new connections to.
func (lb *LoadBalancer) Healthy() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var out []string
	for _, b := range lb.backends {
		if lb.healthy[b.Node] {
			out = append(out, b.Node)
		}
	}
	return out
}

// Sent returns how many connections went to each node, and how many were
// closed because no node was healthy or the chosen one did not answer.
func (lb *LoadBalancer) Sent() (map[string]int, int) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := make(map[string]int, len(lb.sent))
	for k, v := range lb.sent {
		out[k] = v
	}
	return out, lb.failed
}

// pick returns the next healthy backend, round robin.
func (lb *LoadBalancer) pick() (Backend, bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for range lb.backends {
		b := lb.backends[lb.next%len(lb.backends)]
		lb.next++
		if lb.healthy[b.Node] {
			return b, true
		}
	}
	return Backend{}, false
}

func (lb *LoadBalancer) acceptLoop() {
	for {
		c, err := lb.l.Accept()
		if err != nil {
			return
		}
		lb.wg.Go(func() { lb.forward(c) })
	}
}

func (lb *LoadBalancer) forward(down net.Conn) {
	defer down.Close()
	b, ok := lb.pick()
	var up net.Conn
	var err error
	if ok {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		up, err = lb.ns.Dial(ctx, "tcp", b.Addr.String())
		cancel()
	}
	lb.mu.Lock()
	if !ok || err != nil || lb.closed {
		lb.failed++
		lb.mu.Unlock()
		if up != nil {
			up.Close()
		}
		return
	}
	lb.sent[b.Node]++
	lb.conns[down], lb.conns[up] = struct{}{}, struct{}{}
	lb.mu.Unlock()
	defer func() {
		lb.mu.Lock()
		delete(lb.conns, down)
		delete(lb.conns, up)
		lb.mu.Unlock()
		up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); closeWrite(down); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// Close stops the balancer and closes every connection through it.
func (lb *LoadBalancer) Close() {
	lb.stop()
	lb.l.Close()
	lb.mu.Lock()
	lb.closed = true
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
}

// String describes the balancer's state for test failures.
func (lb *LoadBalancer) String() string {
	sent, failed := lb.Sent()
	return fmt.Sprintf("load balancer %s: healthy %v, sent %v, failed %d", lb.Addr(), lb.Healthy(), sent, failed)
}
