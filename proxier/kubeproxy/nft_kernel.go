package kubeproxy

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// nftAttempts bounds the retries when another program changes the ruleset
// between the listing and the batch.
const nftAttempts = 3

// CleanupNFT removes kube-proxy's iptables-nft chains, and the rules of
// other chains that jump or go to them, from nat, filter and mangle of both
// families, over netlink in one batch, and returns them as
// "backend: table/chain". The batch carries the generation of the listing:
// when the ruleset changed in between, it is listed and planned again.
func CleanupNFT(conn *nftnl.Conn) ([]string, error) {
	for attempt := 1; ; attempt++ {
		gen, err := nftnl.Generation(conn)
		if err != nil {
			return nil, err
		}
		listing, err := ListNFT(conn)
		if err != nil {
			return nil, err
		}
		p := PlanNFT(listing)
		if p.Empty() {
			return nil, nil
		}
		err = applyNFT(conn, p, gen)
		if err == nil {
			return p.Removed(), nil
		}
		if attempt == nftAttempts || !errors.Is(err, unix.ERESTART) {
			return nil, err
		}
	}
}

// ListNFT lists the chains of the nat, filter and mangle tables of the ip
// and ip6 families, where iptables-nft keeps its tables. Only tables that
// hold a chain of kube-proxy's have their other chains' jumps read: on a
// node without kube-proxy's chains the listing costs two dumps.
func ListNFT(conn *nftnl.Conn) ([]NFTChain, error) {
	var out []NFTChain
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		chains, err := conn.Chains(f)
		if err != nil {
			return nil, err
		}
		withKube := map[string]bool{}
		for _, c := range chains {
			if slices.Contains(tables, c.Table) && IsChain(c.Chain) {
				withKube[c.Table] = true
			}
		}
		for _, c := range chains {
			if !slices.Contains(tables, c.Table) {
				continue
			}
			nc := NFTChain{Family: f, Table: c.Table, Name: c.Chain}
			if withKube[c.Table] && !IsChain(c.Chain) {
				jumps, err := conn.Jumps(f, c.Table, c.Chain)
				if err != nil {
					return nil, err
				}
				for _, j := range jumps {
					nc.Jumps = append(nc.Jumps, NFTJump{Handle: j.Handle, Target: j.Target})
				}
			}
			out = append(out, nc)
		}
	}
	return out, nil
}

// applyNFT sends p as one batch, checked against generation gen.
func applyNFT(conn *nftnl.Conn, p NFTPlan, gen uint32) error {
	rules := make([]nftnl.RuleRef, len(p.Rules))
	for i, r := range p.Rules {
		rules[i] = nftnl.RuleRef(r)
	}
	chains := make([]nftnl.ChainRef, len(p.Chains))
	for i, c := range p.Chains {
		chains[i] = nftnl.ChainRef{Family: c.Family, Table: c.Table, Chain: c.Name}
	}
	if err := conn.DeleteRulesAndChains(gen, rules, chains); err != nil {
		return fmt.Errorf("delete kube-proxy's iptables-nft chains (%d) and the %d rules jumping to them: %w", len(p.Chains), len(p.Rules), err)
	}
	return nil
}
