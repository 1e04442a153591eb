// The destinations NodePorts answer on: the node's addresses as the configuration selects them.

package proxier

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// nodePortPrefixes are the destinations NodePorts answer on in the compiled
// family; nil means every local address.
func (c *compiler) nodePortPrefixes() []netip.Prefix {
	if c.cfg.NodePortPrimary {
		if a := c.primaryAddr(); a.IsValid() && !a.IsLoopback() {
			return []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}
		}
		return nil
	}
	var out []netip.Prefix
	for _, p := range c.cfg.NodePortAddresses {
		if !c.cfg.inFamily(p) {
			continue
		}
		if p.Bits() == 0 {
			return nil
		}
		out = append(out, p.Masked())
	}
	return out
}

// primaryAddr is the node's primary address of the compiled family, as
// kube-proxy picks it: bindAddress, else the Node's first address.
func (c *compiler) primaryAddr() netip.Addr { return primaryAddr(c.cfg, &c.node) }

func primaryAddr(cfg Config, node *k8s.Node) netip.Addr {
	if cfg.addrInFamily(cfg.BindAddress) && !cfg.BindAddress.IsUnspecified() {
		return cfg.BindAddress
	}
	for _, a := range node.Addrs {
		if cfg.addrInFamily(a) {
			return a
		}
	}
	return netip.Addr{}
}

func (c *compiler) nodePortMatch() [][]m.Expr {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	localhost := c.cfg.LocalhostNodePorts && c.cfg.Family == m.IPv4
	prefixes := c.nodePortPrefixes()
	if len(prefixes) == 0 {
		if localhost {
			return [][]m.Expr{{m.MatchFibDaddrLocal{}}}
		}
		if c.cfg.Family == m.IPv6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		return [][]m.Expr{{m.MatchPrefix{Field: m.FieldDaddr, Prefix: loopback, Negate: true}, m.MatchFibDaddrLocal{}}}
	}
	if localhost && !slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Overlaps(loopback) }) {
		prefixes = append(prefixes, loopback)
	}
	var out [][]m.Expr
	for _, p := range prefixes {
		out = append(out, []m.Expr{m.MatchFibDaddrLocal{}, m.MatchPrefix{Field: m.FieldDaddr, Prefix: p}})
	}
	return out
}
