// The localnet guard (CVE-2020-8558) and the record in its comment that nftproxy set route_localnet.

package proxier

import (
	"net/netip"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// localnetGuard is kube-proxy's rule against CVE-2020-8558: with
// route_localnet set (--localhost-nodeports), a neighbour could reach the
// node's 127.0.0.1 services with a frame addressed to the node. Drop packets
// to 127.0.0.0/8 that come from elsewhere, unless they belong to a
// connection that is established, related or DNATed (a localhost NodePort).
func (c *compiler) localnetGuard() (m.Rule, bool) {
	if !c.cfg.LocalhostNodePorts || c.cfg.Family != m.IPv4 {
		return m.Rule{}, false
	}
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	return m.Rule{Exprs: []m.Expr{
		m.MatchPrefix{Field: m.FieldDaddr, Prefix: loopback},
		m.MatchPrefix{Field: m.FieldSaddr, Prefix: loopback, Negate: true},
		m.MatchCtStateEstablished{Negate: true},
		m.MatchCtStatusDNAT{Negate: true},
		m.Verdict{Kind: m.Drop},
	}, Comment: c.localnetComment()}, true
}

// The localnet guard's comments: the second says nftproxy set route_localnet.
const (
	localnetGuardComment = "block incoming localnet connections"
	localnetOwnedComment = localnetGuardComment + "; route_localnet set by nftproxy"
)

func (c *compiler) localnetComment() string {
	if c.cfg.RouteLocalnetOwned {
		return localnetOwnedComment
	}
	return localnetGuardComment
}

// RouteLocalnetOwned tells whether rs, an IPv4 table read from the kernel,
// says that nftproxy turned route_localnet on.
func RouteLocalnetOwned(rs *m.Ruleset) bool {
	if rs == nil {
		return false
	}
	for _, ch := range rs.Chains {
		if ch.Name != chainFilterInput {
			continue
		}
		for _, r := range ch.Rules {
			if r.Comment == localnetOwnedComment {
				return true
			}
		}
	}
	return false
}
