package main

import (
	"fmt"
	"slices"
	"strings"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// changesScript writes c as one nft script, in the order ApplyChanges sends
// it, so `nft -f` applies the same change in one transaction. New sets and
// rewritten chains are declared through nftmodel.Render; elements are
// written here (their values through nftmodel.RenderValues), since the
// model renders them only inside whole sets.
func changesScript(f m.Family, table string, c *m.Changes) string {
	var b strings.Builder
	for _, se := range c.DelElements {
		writeElements(&b, "delete", f, table, se, false)
	}
	for _, ch := range c.RewriteChains {
		// A new chain has no rules to flush.
		if !slices.ContainsFunc(c.AddChains, func(a *m.Chain) bool { return a.Name == ch.Name }) {
			fmt.Fprintf(&b, "flush chain %s %s %s\n", f, table, ch.Name)
		}
	}
	if len(c.AddSets) > 0 || len(c.RewriteChains) > 0 {
		b.WriteString(m.Render(&m.Ruleset{Family: f, Table: table, Sets: c.AddSets, Chains: c.RewriteChains}))
	}
	for _, name := range c.DelChains {
		fmt.Fprintf(&b, "flush chain %s %s %s\n", f, table, name)
	}
	for _, se := range c.AddElements {
		writeElements(&b, "add", f, table, se, true)
	}
	for _, name := range c.DelSets {
		fmt.Fprintf(&b, "delete set %s %s %s\n", f, table, name)
	}
	for _, name := range c.DelChains {
		fmt.Fprintf(&b, "delete chain %s %s %s\n", f, table, name)
	}
	return b.String()
}

func writeElements(b *strings.Builder, verb string, f m.Family, table string, se m.SetElements, values bool) {
	fmt.Fprintf(b, "%s element %s %s %s { ", verb, f, table, se.Set)
	for i, e := range se.Elements {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.RenderValues(se.Key, e.Key))
		if !values {
			continue
		}
		if e.Comment != "" {
			fmt.Fprintf(b, " comment %q", e.Comment)
		}
		switch {
		case e.Verdict != nil:
			b.WriteString(" : " + m.RenderRule(f, m.Rule{Exprs: []m.Expr{*e.Verdict}}))
		case len(se.Data) > 0:
			b.WriteString(" : " + m.RenderValues(se.Data, e.Data))
		}
	}
	b.WriteString(" }\n")
}
