package main

import (
	"fmt"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
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
	text := iptablesRestore{jumps: true}.text(snapshot(n, nil).Services)
	return loadFresh(res, n, runs, be.full, text, be.args(false)...)
}

// iptablesUpdates loads n services once, then times runs of each update as
// kube-proxy's partial sync writes it (top-level chains and the changed
// service's chains) and, with full, as its full sync does (every chain).
func iptablesUpdates(res *Results, be backend, n, runs int, full bool) error {
	return freshNS(func(ns *netns.NS) error {
		ch := &changer{snap: snapshot(n, nil)}
		if _, err := timeTool(ns, iptablesRestore{jumps: true}.text(ch.snap.Services), be.args(false)...); err != nil {
			return err
		}
		// An endpoint change deletes the replaced endpoint's KUBE-SEP chain.
		endpointChange := func(run int) (change, []string) {
			c := ch.endpointChange(run, runs)
			sp := &ch.snap.Services[c.service]
			return c, []string{sepChain(sp, sp.Endpoints[len(sp.Endpoints)-1])}
		}
		serviceAdded := func(int) (change, []string) { return ch.serviceAdded(), nil }
		for _, k := range []struct {
			metric string
			next   func(run int) (change, []string)
		}{{metricEndpointChange, endpointChange}, {metricServiceAdded, serviceAdded}} {
			// all writes every chain, as kube-proxy's full sync does.
			step := func(all bool) func(run int) (time.Duration, error) {
				return func(run int) (time.Duration, error) {
					c, stale := k.next(run)
					r := iptablesRestore{only: map[int]bool{c.service: true}, stale: stale}
					if all {
						r.only = nil
					}
					d, err := timeTool(ns, r.text(c.snap.Services), be.args(true)...)
					ch.snap = c.snap
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
