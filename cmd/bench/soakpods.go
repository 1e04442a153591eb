package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// The soak's pods: a few pod namespaces on the topology's bridge, each
// holding a quarter of the endpoint pool as a local route (every address
// of it is the namespace's own), with one server on port 8080 that answers
// a connection to an address whose pod runs with that address and its
// service, and resets one to an address whose pod has exited.

// soakPool holds every endpoint address of the soak: the workload's and the
// replacements'. It is split evenly over the pods.
var soakPool = netip.MustParsePrefix("10.128.0.0/16")

const soakPods = 4

// soakPodRange returns the part of the pool pod k serves.
func soakPodRange(k int) netip.Prefix {
	bits := soakPool.Bits() + 2 // four pods
	return netip.PrefixFrom(addrPlus(soakPool.Addr(), uint32(k)<<(32-bits)), bits)
}

type deadHit struct {
	at   time.Time
	addr netip.Addr
}

// startPods routes each pod's part of the pool to it and starts its server;
// Topology.Close stops them.
func (s *soak) startPods() error {
	for k, p := range s.topo.Pods {
		r := soakPodRange(k)
		if err := p.NS.IPBatch(fmt.Sprintf("route add local %s dev lo", r)); err != nil {
			return err
		}
		if err := s.topo.Node.IPBatch(fmt.Sprintf("route add %s via %s dev %s", r, p.Addr, netns.BridgeName)); err != nil {
			return err
		}
		if err := p.ServeTCP(endpointPort, s.answer); err != nil {
			return err
		}
	}
	return nil
}

// answer writes "ADDRESS SERVICE" when a pod runs at the address the
// connection reached, and resets the connection when none does.
func (s *soak) answer(c net.Conn) {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap() // the server listens on both families
	svc, ok := s.model.owners.get(local)
	if !ok {
		s.dead.add(deadHit{time.Now(), local})
		if tc, isTCP := c.(*net.TCPConn); isTCP {
			_ = tc.SetLinger(0)
		}
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = fmt.Fprintf(c, "%s %d\n", local, svc)
}

// Failed connections, by what went wrong.
const (
	failConnect   = "connect"       // no handshake: refused, unreachable or timed out
	failNoAnswer  = "no answer"     // reset or closed: no pod at the endpoint
	failWrongSvc  = "wrong service" // answered by another service's pod
	failBadAnswer = "bad answer"
)

// soakClients connect from the client namespace through the services'
// ClusterIPs, half to services that changed last, half to any service.
type soakClients struct {
	ns       *netns.NS
	services []wlService
	recent   *recentRing
	rate     int // connections a second

	attempts atomic.Int64
	failed   eventLog[soakFailure]
}

type soakFailure struct {
	at         time.Time
	kind, what string
}

const soakFailureExamples = 5

// run connects at the set rate until ctx ends, with at most inflight
// connections open, and records how each failed; it returns once the last
// connection has ended.
func (c *soakClients) run(ctx context.Context, inflight int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	tick := time.NewTicker(time.Second / time.Duration(c.rate))
	defer tick.Stop()
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		svc := rng.IntN(len(c.services))
		if rng.IntN(2) == 0 {
			if r, ok := c.recent.pick(rng); ok {
				svc = r
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			c.attempts.Add(1)
			// The connect and the answer had a timeout each before they
			// went through one ask: its budget is both.
			if kind, what := c.ask(svc, 2*soakConnTimeout); kind != "" {
				c.failed.add(soakFailure{time.Now(), kind, what})
			}
		})
	}
}

// ask connects to the service and checks who answered; kind is "" when its
// own pod did, or else says what went wrong.
func (c *soakClients) ask(svc int, timeout time.Duration) (kind, what string) {
	s := &c.services[svc]
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	line, err := c.ns.AskTCP(ctx, netip.AddrPortFrom(s.clusterIP, servicePort))
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return failConnect, fmt.Sprintf("%s: %v", s.name, err)
	case err != nil:
		return failNoAnswer, fmt.Sprintf("%s: %v", s.name, err)
	}
	addr, owner, ok := strings.Cut(line, " ")
	got, err := strconv.Atoi(owner)
	switch {
	case !ok || err != nil:
		return failBadAnswer, fmt.Sprintf("%s: %q", s.name, line)
	case got != svc:
		return failWrongSvc, fmt.Sprintf("%s: answered by %s of %s", s.name, addr, c.services[got].name)
	}
	return "", ""
}

// report records the connections in run: how many, how many failed by
// kind, and the first few failures.
func (c *soakClients) report(run *SoakRun) {
	failed := c.failed.since(0)
	run.Connections, run.Failed, run.FailedBy = int(c.attempts.Load()), len(failed), map[string]int{}
	for i, f := range failed {
		run.FailedBy[f.kind]++
		if i < soakFailureExamples {
			run.Examples = append(run.Examples, stamp(f.at)+" "+f.kind+": "+f.what)
		}
	}
}
