package main

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
)

// backend is one iptables-restore binary.
type backend struct {
	restore       string // the binary
	full, partial string // method names of its full and partial restores
}

var (
	legacy = backend{"iptables-legacy-restore", methodLegacy, methodLegacyPartial}
	iptNft = backend{"iptables-nft-restore", methodIptNft, methodIptNftPartial}
)

// restoreArgs are kube-proxy's: wait for the xtables lock, and never flush
// tables on updates (chains named in the input are flushed and rewritten).
func (be backend) args(noflush bool) []string {
	args := []string{be.restore, "-w", "60"}
	if noflush {
		args = append(args, "--noflush")
	}
	return args
}

// fullSyncIptables loads kube-proxy's ruleset for n services into fresh
// namespaces. Generating the text is not timed.
func fullSyncIptables(res *Results, be backend, n, runs int) error {
	text := iptablesRestore{jumps: true}.text(iptServices(snapshot(n, nil)))
	return loadFresh(res, n, runs, be.full, text, be.args(false)...)
}

// iptablesUpdates loads n services once, then times runs of each update as
// kube-proxy's partial sync writes it (top-level chains and the changed
// service's chains) and, with full, as its full sync does (every chain).
func iptablesUpdates(res *Results, be backend, n, runs int, full bool) error {
	return freshNS(func(ns *netns.NS) error {
		services := iptServices(snapshot(n, nil))
		if _, err := timeTool(ns, iptablesRestore{jumps: true}.text(services), be.args(false)...); err != nil {
			return err
		}
		fresh := 0
		endpointChange := func(run int) (iptablesRestore, []iptService) {
			i := (run + 1) * len(services) / (runs + 2)
			fresh++
			next := append([]iptService(nil), services...)
			s := &next[i]
			old := s.endpoints[len(s.endpoints)-1]
			s.endpoints = append(append([]netip.AddrPort(nil), s.endpoints[:len(s.endpoints)-1]...),
				netip.AddrPortFrom(endpointAddr(uint32(1<<21+fresh)), endpointPort))
			return iptablesRestore{only: map[int]bool{i: true}, stale: []string{sepChain(s, old)}}, next
		}
		serviceAdded := func(int) (iptablesRestore, []iptService) {
			i := len(services)
			next := append(append([]iptService(nil), services...), iptServices(&k8s.Snapshot{Services: []k8s.ServicePort{service(i)}})[0])
			return iptablesRestore{only: map[int]bool{i: true}}, next
		}
		for _, k := range []struct {
			metric string
			next   func(run int) (iptablesRestore, []iptService)
		}{{metricEndpointChange, endpointChange}, {metricServiceAdded, serviceAdded}} {
			// all writes every chain, as kube-proxy's full sync does.
			step := func(all bool) func(run int) (time.Duration, error) {
				return func(run int) (time.Duration, error) {
					r, next := k.next(run)
					if all {
						r.only = nil
					}
					d, err := timeTool(ns, r.text(next), be.args(true)...)
					services = next
					return d, err
				}
			}
			if full {
				whole, err := repeat(runs, step(true))
				if err != nil {
					return fmt.Errorf("%s: %w", k.metric, err)
				}
				res.add(n, k.metric, be.full, whole...)
			}
			partial, err := repeat(runs, step(false))
			if err != nil {
				return fmt.Errorf("%s: %w", k.metric, err)
			}
			res.add(n, k.metric, be.partial, partial...)
		}
		return nil
	})
}
