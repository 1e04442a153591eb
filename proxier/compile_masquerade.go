// What is masqueraded: the mark bit, and the pods' traffic as the detect-local mode tells it.

package proxier

import (
	"net/netip"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// masqueradeMark is the mark bit that asks for masquerade.
func (c *compiler) masqueradeMark() uint32 {
	if c.cfg.MasqueradeBit == 0 {
		return markMasquerade
	}
	return 1 << c.cfg.MasqueradeBit
}

// localTraffic matches traffic from this cluster's pods as the detect-local
// mode says (negate: traffic from anywhere else); ok is false when the mode
// knows no local traffic for the compiled family.
func (c *compiler) localTraffic(negate bool) ([]m.Expr, bool) {
	prefix := func(ps []netip.Prefix) ([]m.Expr, bool) {
		for _, p := range ps {
			if c.cfg.inFamily(p) {
				return []m.Expr{m.MatchPrefix{Field: m.FieldSaddr, Prefix: p.Masked(), Negate: negate}}, true
			}
		}
		return nil, false
	}
	switch c.cfg.DetectLocal.Mode {
	case "", LocalClusterCIDR:
		return prefix(c.cfg.ClusterCIDRs)
	case LocalNodeCIDR:
		return prefix(c.node.PodCIDRs)
	case LocalBridgeInterface:
		return []m.Expr{m.MatchIifname{Name: c.cfg.DetectLocal.Interface, Negate: negate}}, true
	case LocalInterfaceNamePrefix:
		return []m.Expr{m.MatchIifname{Name: c.cfg.DetectLocal.Interface + "*", Negate: negate}}, true
	}
	return nil, false
}

// clusterMasquerade is the rule that marks ClusterIP traffic for masquerade:
// everything with --masquerade-all, else what does not come from the
// cluster's pods, as the detect-local mode tells them.
func (c *compiler) clusterMasquerade() (m.Rule, bool) {
	if c.cfg.MasqueradeAll {
		return jump(chainMarkForMasquerade), true
	}
	match, ok := c.localTraffic(true)
	if !ok {
		return m.Rule{}, false
	}
	return m.Rule{Exprs: append(match, m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade})}, true
}
