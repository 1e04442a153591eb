package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// Bounds of one target's sampling, so a broken size cannot stall the run.
const (
	connectTimeout   = 2 * time.Second
	samplingBudget   = 30 * time.Second
	warmupConnects   = 20
	maxFailedConnect = 5
)

// dataplanePhase times TCP connects from the client namespace to the first-
// and the last-created service at every size, with nftproxy's ruleset and
// then with kube-proxy's iptables ruleset (legacy backend) in the node
// namespace. Both services point at the topology's real pods; every other
// service has endpoints of its own that nothing answers on.
func dataplanePhase(res *Results, o *options) (err error) {
	topo, err := netns.BuildTopology(netns.TopologyOptions{Prefix: nsPrefix + "d", Pods: 3})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	var pods []netip.Addr
	for _, p := range topo.Pods {
		if _, err := p.ServeName("tcp", endpointPort); err != nil {
			return err
		}
		pods = append(pods, p.Addr)
	}
	conn, err := nftnl.Dial(topo.Node.Fd())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()

	for _, n := range o.sizes {
		snap := snapshot(n, map[int][]netip.Addr{0: pods, n - 1: pods})
		targets := []netip.AddrPort{
			netip.AddrPortFrom(clusterIP(0), servicePort),
			netip.AddrPortFrom(clusterIP(n-1), servicePort),
		}
		logf("dataplane, %d services: nftproxy", n)
		if _, err := nftnl.Apply(conn, proxier.Compile(snap, compileConfig)); err != nil {
			return err
		}
		first, last, err := sampleConnects(topo.Client, targets, o.samples)
		if err != nil {
			return fmt.Errorf("nftproxy at %d services: %w", n, err)
		}
		res.add(n, metricConnect, methodConnNftFirst, first...)
		res.add(n, metricConnect, methodConnNftLast, last...)
		if err := nftnl.Delete(conn, m.IPv4, proxier.TableName); err != nil {
			return err
		}
		flushConntrack(topo.Node)

		logf("dataplane, %d services: iptables-legacy", n)
		text := iptablesRestore{jumps: true}.text(snap.Services)
		if _, err := timeTool(topo.Node, text, legacy.args(false)...); err != nil {
			return err
		}
		first, last, err = sampleConnects(topo.Client, targets, o.samples)
		if err != nil {
			return fmt.Errorf("iptables at %d services: %w", n, err)
		}
		res.add(n, metricConnect, methodConnLegacyFirst, first...)
		res.add(n, metricConnect, methodConnLegacyLast, last...)
		// A restore without --noflush empties the tables it names.
		if _, err := timeTool(topo.Node, "*filter\nCOMMIT\n*nat\nCOMMIT\n", legacy.args(false)...); err != nil {
			return err
		}
		flushConntrack(topo.Node)
	}
	return nil
}

// flushConntrack forgets the previous ruleset's NAT bindings so they can't
// serve a later connection that reuses a source port.
func flushConntrack(ns *netns.NS) {
	if _, err := ns.Exec("conntrack", "-F"); err != nil {
		logf("flush conntrack: %v", err)
	}
}

// sampleConnects times samples connects to each of two targets, taking them
// in turn so load from elsewhere on the machine hits both alike. It returns
// milliseconds per connect.
func sampleConnects(client *netns.NS, targets []netip.AddrPort, samples int) (first, last []float64, err error) {
	for range warmupConnects {
		for _, t := range targets {
			if _, err := connectOnce(client, t); err != nil {
				return nil, nil, fmt.Errorf("warm up %s: %w", t, err)
			}
		}
	}
	out := make([][]float64, len(targets))
	failed := 0
	deadline := time.Now().Add(samplingBudget)
	for i := 0; i < samples && time.Now().Before(deadline); i++ {
		for j, t := range targets {
			d, err := connectOnce(client, t)
			if err != nil {
				if failed++; failed > maxFailedConnect {
					return nil, nil, fmt.Errorf("connect to %s: %w", t, err)
				}
				continue
			}
			out[j] = append(out[j], ms(d))
		}
	}
	return out[0], out[1], nil
}

// connectOnce opens a TCP connection from the client namespace and reads the
// first line the name server sends: the handshake through the node's DNAT
// and the first byte back.
func connectOnce(client *netns.NS, to netip.AddrPort) (time.Duration, error) {
	var took time.Duration
	err := client.Do(func() error {
		start := time.Now()
		c, err := net.DialTimeout("tcp", to.String(), connectTimeout)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetReadDeadline(start.Add(connectTimeout)); err != nil {
			return err
		}
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return fmt.Errorf("read name: %w", err)
		}
		took = time.Since(start)
		return nil
	})
	return took, err
}
