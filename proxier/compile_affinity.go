// Session affinity in the ruleset: the affinity map's bounds, the chain that remembers, the lookups before a random pick.

package proxier

import (
	"slices"
	"time"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// affinityMapTimeout is the affinity map's declared timeout, kube-proxy's
// default affinity; elements carry their service's.
const affinityMapTimeout = 3 * time.Hour

// affinityMapSize bounds the clients the affinity map remembers on a node,
// for every service: 16 times what each per-endpoint set of kube-proxy
// holds (nft's default, 65535); at worst (a flood of new sources) on the
// order of 100-200 MB of kernel memory (an estimate: a hash element of
// ~100-200 bytes each). A client the full map can't take is picked at
// random, without affinity.
const affinityMapSize = 1 << 20

// affinityProtocols are the protocols whose connections affinity
// remembers: nft types `ct original proto-dst` only after a protocol match,
// so each has its rule.
var affinityProtocols = []uint8{6, 17, 132}

// affinityCheck sends a new DNATed connection whose service entry has
// affinity to the chain of its timeout: by the entry's address and port
// before DNAT, or by its port alone for a NodePort. (A connection to
// another service's address on a port some NodePort with affinity uses is
// remembered too; no lookup ever asks for it.)
func (c *compiler) affinityCheck() *m.Chain {
	ch := &m.Chain{Name: chainAffinityCheck}
	for _, proto := range affinityProtocols {
		l4 := m.MatchL4Proto{Proto: proto}
		ch.Rules = append(ch.Rules,
			m.Rule{Exprs: []m.Expr{l4, m.VerdictMap{Key: []m.Field{m.FieldCtOriginalDaddr, m.FieldL4Proto, m.FieldCtOriginalProtoDst}, Map: mapAffinityServices}}},
			m.Rule{Exprs: []m.Expr{l4, m.VerdictMap{Key: []m.Field{m.FieldL4Proto, m.FieldCtOriginalProtoDst}, Map: mapAffinityNodePorts}}})
	}
	return ch
}

// withAffinityLookups puts before every random pick the same rule with the
// client's remembered endpoint instead: a client the affinity map doesn't
// hold makes that rule not match.
func withAffinityLookups(rules []m.Rule) []m.Rule {
	out := make([]m.Rule, 0, 2*len(rules))
	for _, r := range rules {
		last := len(r.Exprs) - 1
		if d, ok := r.Exprs[last].(m.DNATMap); ok && d.Numgen > 0 {
			lookup := m.Rule{Exprs: append(slices.Clone(r.Exprs[:last]), m.DNATMap{Key: clientKey, Map: mapAffinity})}
			out = append(out, lookup)
		}
		out = append(out, r)
	}
	return out
}
