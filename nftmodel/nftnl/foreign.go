package nftnl

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// Other programs' tables, which the model can't describe (iptables-nft's,
// for one): their chains (Conn.Chains), the rules that jump to other chains
// (Conn.Jumps), and one batch that deletes given rules and chains
// (Conn.DeleteRulesAndChains).

// Jump is a rule that jumps or goes to Target; its handle names it for
// deletion.
type Jump struct {
	Handle uint64
	Target string
}

// Jumps lists the rules of chain in the table (f, table) that end in a jump
// or goto verdict (as iptables-nft writes -j CHAIN and -g CHAIN), in the
// chain's order.
func (c *Conn) Jumps(f nftmodel.Family, table, chain string) ([]Jump, error) {
	t := &nftables.Table{Family: libFamily(f), Name: table}
	rules, err := c.getRules(t, &nftables.Chain{Table: t, Name: chain})
	if err != nil {
		return nil, fmt.Errorf("list rules of chain %s in table %s %s: %w", chain, f, table, err)
	}
	var out []Jump
	for _, r := range rules {
		for _, e := range r.Exprs {
			if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
				out = append(out, Jump{Handle: r.Handle, Target: v.Chain})
			}
		}
	}
	return out, nil
}

// ChainRef names a chain of any table of any family.
type ChainRef struct {
	Family nftmodel.Family
	Table  string
	Chain  string
}

// RuleRef names a rule by its chain and handle.
type RuleRef struct {
	Family nftmodel.Family
	Table  string
	Chain  string
	Handle uint64
}

func (r ChainRef) lib() *nftables.Chain {
	return &nftables.Chain{Name: r.Chain, Table: &nftables.Table{Family: libFamily(r.Family), Name: r.Table}}
}

// DeleteRulesAndChains deletes, in one batch, rules, then every rule of
// chains, then chains: the chains may jump to each other, and when rules
// are all the jumps to them from other chains, nothing references them by
// the time they go.
//
// A non-zero gen guards the batch: if the ruleset changed since that
// generation (read with Generation before listing what to delete), the
// kernel refuses it whole with ERESTART and the caller lists again.
func (c *Conn) DeleteRulesAndChains(gen uint32, rules []RuleRef, chains []ChainRef) error {
	b := newTablesBatch(c, fmt.Sprintf("%d rules and %d chains", len(rules), len(chains)))
	for _, r := range rules {
		lc := ChainRef{r.Family, r.Table, r.Chain}.lib()
		lr := &nftables.Rule{Table: lc.Table, Chain: lc, Handle: r.Handle}
		b.plan(1, func() error { return b.lib.DelRule(lr) }, "delete rule handle %d of chain %s in table %s %s", r.Handle, r.Chain, r.Family, r.Table)
	}
	for _, ch := range chains {
		lc := ch.lib()
		b.plan1(func() { b.lib.FlushChain(lc) }, "flush chain %s in table %s %s", ch.Chain, ch.Family, ch.Table)
	}
	for _, ch := range chains {
		lc := ch.lib()
		b.plan1(func() { b.lib.DelChain(lc) }, "delete chain %s in table %s %s", ch.Chain, ch.Family, ch.Table)
	}
	_, err := b.send("delete", gen)
	return err
}
