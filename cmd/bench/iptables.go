package main

import (
	"fmt"

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
		for _, k := range ch.kinds(runs) {
			// kube-proxy's full sync writes every chain, its partial sync
			// the changed service's alone; the two take turns run by run,
			// so each starts from a table the other just wrote.
			took := map[bool][]float64{}
			for run := range runs {
				for _, all := range []bool{true, false} {
					if all && !full {
						continue
					}
					c := k.next(run)
					r := iptablesRestore{only: map[int]bool{c.service: true}}
					for _, e := range c.gone {
						r.stale = append(r.stale, sepChain(&c.snap.Services[c.service], e))
					}
					if all {
						r.only = nil
					}
					d, err := timeTool(ns, r.text(c.snap.Services), be.args(true)...)
					if err != nil {
						return fmt.Errorf("%s: %w", k.metric, err)
					}
					ch.snap = c.snap
					took[all] = append(took[all], ms(d))
				}
			}
			if full {
				res.add(n, k.metric, be.full, took[true]...)
			}
			res.add(n, k.metric, be.partial, took[false]...)
		}
		return nil
	})
}
