package kubeproxy

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// nftAttempts bounds the retries when another program changes the ruleset
// between the listing and the batch.
const nftAttempts = 3

// CleanupNFT removes kube-proxy's iptables-nft chains, and the rules of
// other chains that jump or go to them, from nat, filter and mangle of both
// families, over netlink in one batch, and returns them as
// "backend: table/chain". The batch carries the generation of the listing:
// when the ruleset changed in between, it is listed and planned again.
func CleanupNFT(conn *nftables.Conn) ([]string, error) {
	for attempt := 1; ; attempt++ {
		gen, err := conn.GetGen()
		if err != nil {
			return nil, fmt.Errorf("get ruleset generation: %w", err)
		}
		listing, err := ListNFT(conn)
		if err != nil {
			return nil, err
		}
		p := PlanNFT(listing)
		if p.Empty() {
			return nil, nil
		}
		err = applyNFT(conn, p, gen.ID)
		if err == nil {
			return p.Removed(), nil
		}
		if attempt == nftAttempts || !errors.Is(err, unix.ERESTART) {
			return nil, err
		}
	}
}

func libFamily(f nftmodel.Family) nftables.TableFamily {
	if f == nftmodel.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// ListNFT lists the chains of the nat, filter and mangle tables of the ip
// and ip6 families, where iptables-nft keeps its tables. Only tables that
// hold a chain of kube-proxy's have their other chains' jumps read: on a
// node without kube-proxy's chains the listing costs two dumps.
func ListNFT(conn *nftables.Conn) ([]NFTChain, error) {
	var out []NFTChain
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		chains, err := conn.ListChainsOfTableFamily(libFamily(f))
		if err != nil {
			return nil, fmt.Errorf("list %s chains: %w", f, err)
		}
		withKube := map[string]bool{}
		for _, c := range chains {
			if slices.Contains(tables, c.Table.Name) && IsChain(c.Name) {
				withKube[c.Table.Name] = true
			}
		}
		for _, c := range chains {
			if !slices.Contains(tables, c.Table.Name) {
				continue
			}
			nc := NFTChain{Family: f, Table: c.Table.Name, Name: c.Name}
			if withKube[c.Table.Name] && !IsChain(c.Name) {
				if nc.Jumps, err = jumps(conn, c); err != nil {
					return nil, err
				}
			}
			out = append(out, nc)
		}
	}
	return out, nil
}

// jumps returns the rules of c that end in a jump or goto verdict.
func jumps(conn *nftables.Conn, c *nftables.Chain) ([]NFTJump, error) {
	rules, err := conn.GetRules(c.Table, c)
	if err != nil {
		return nil, fmt.Errorf("list rules of chain %s in table %s: %w", c.Name, c.Table.Name, err)
	}
	var out []NFTJump
	for _, r := range rules {
		for _, e := range r.Exprs {
			if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
				out = append(out, NFTJump{Handle: r.Handle, Target: v.Chain})
			}
		}
	}
	return out, nil
}

// applyNFT sends p as one batch, checked against generation gen.
func applyNFT(conn *nftables.Conn, p NFTPlan, gen uint32) error {
	chain := func(f nftmodel.Family, table, name string) *nftables.Chain {
		return &nftables.Chain{Name: name, Table: &nftables.Table{Family: libFamily(f), Name: table}}
	}
	for _, r := range p.Rules {
		c := chain(r.Family, r.Table, r.Chain)
		if err := conn.DelRule(&nftables.Rule{Table: c.Table, Chain: c, Handle: r.Handle}); err != nil {
			return fmt.Errorf("delete rule %d of chain %s in table %s %s: %w", r.Handle, r.Chain, r.Family, r.Table, err)
		}
	}
	for _, c := range p.Chains {
		conn.FlushChain(chain(c.Family, c.Table, c.Name))
	}
	for _, c := range p.Chains {
		conn.DelChain(chain(c.Family, c.Table, c.Name))
	}
	if err := conn.FlushWithGenID(gen); err != nil {
		return fmt.Errorf("delete kube-proxy's iptables-nft chains (%d) and the %d rules jumping to them: %w", len(p.Chains), len(p.Rules), err)
	}
	return nil
}
