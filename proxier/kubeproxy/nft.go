package kubeproxy

import (
	"cmp"
	"slices"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// NFTChain is one chain of an iptables-nft table as the kernel lists it:
// iptables-nft keeps its tables as nftables tables of the ip and ip6
// families, one nftables chain per iptables chain.
type NFTChain struct {
	Family nftmodel.Family
	Table  string // nat, filter, mangle, ...
	Name   string
	// Jumps are the chain's rules that jump or go to another chain (an
	// nftables verdict, as iptables-nft writes -j CHAIN and -g CHAIN).
	Jumps []NFTJump
}

// NFTJump is a rule that jumps or goes to Target.
type NFTJump struct {
	Handle uint64
	Target string
}

// NFTRule names one rule to delete.
type NFTRule struct {
	Family nftmodel.Family
	Table  string
	Chain  string
	Handle uint64
}

// NFTPlan is what removes kube-proxy's iptables-nft chains, in the order of
// one batch: the rules of other chains that jump or go to them, then the
// chains, each flushed and deleted (a chain is deleted only once nothing
// jumps to it; flushing them all first drops their jumps to each other).
type NFTPlan struct {
	Rules  []NFTRule
	Chains []NFTChain // with no Jumps
}

// Empty tells whether there is nothing to delete.
func (p NFTPlan) Empty() bool { return len(p.Rules) == 0 && len(p.Chains) == 0 }

// Removed names the chains p deletes as "backend: table/chain", as
// CleanupIPTables reports them.
func (p NFTPlan) Removed() []string {
	out := make([]string, 0, len(p.Chains))
	for _, c := range p.Chains {
		out = append(out, nftBackend(c.Family)+": "+c.Table+"/"+c.Name)
	}
	return out
}

func nftBackend(f nftmodel.Family) string {
	if f == nftmodel.IPv6 {
		return "ip6tables-nft"
	}
	return "iptables-nft"
}

// PlanNFT decides, from a listing of iptables-nft chains, what removes
// kube-proxy's chains from nat, filter and mangle and the rules of other
// chains there that jump or go to them; kubelet's chains and everything
// else stay. The rules of kube-proxy's own chains go with them, so the
// listing needs no Jumps for those. The plan is sorted by family, table
// and chain, rules in listing order.
func PlanNFT(listing []NFTChain) NFTPlan {
	type key struct {
		f     nftmodel.Family
		table string
	}
	kube := map[key]map[string]bool{}
	var p NFTPlan
	for _, c := range listing {
		if !slices.Contains(tables, c.Table) || !IsChain(c.Name) {
			continue
		}
		k := key{c.Family, c.Table}
		if kube[k] == nil {
			kube[k] = map[string]bool{}
		}
		kube[k][c.Name] = true
		p.Chains = append(p.Chains, NFTChain{Family: c.Family, Table: c.Table, Name: c.Name})
	}
	for _, c := range listing {
		if IsChain(c.Name) {
			continue
		}
		for _, j := range c.Jumps {
			if kube[key{c.Family, c.Table}][j.Target] {
				p.Rules = append(p.Rules, NFTRule{Family: c.Family, Table: c.Table, Chain: c.Name, Handle: j.Handle})
			}
		}
	}
	slices.SortStableFunc(p.Rules, func(a, b NFTRule) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Table, b.Table), cmp.Compare(a.Chain, b.Chain))
	})
	slices.SortFunc(p.Chains, func(a, b NFTChain) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Table, b.Table), cmp.Compare(a.Name, b.Name))
	})
	return p
}
