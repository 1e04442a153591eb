package proxier

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// firewall lets only loadBalancerSourceRanges reach a load balancer
// address key: the key joins firewall-ips, and each allowed range of
// sources joins firewall-allow under it. Like kube-proxy, when a range
// holds one of the node's addresses, the service's load balancer addresses
// are allowed sources too: a node that has the address itself reaches it
// from that address.
func (c *compiler) firewall(p *piece, sp *k8s.ServicePort, key []m.Value) {
	p.elements = append(p.elements, keyedElement{c.firewallIPs, m.Element{Key: key, Comment: sp.Name.String()}})
	var sources []netip.Prefix
	nodeAllowed := false
	for _, r := range sp.LoadBalancerSourceRanges {
		if !c.cfg.inFamily(r) {
			continue
		}
		sources = append(sources, r.Masked())
		nodeAllowed = nodeAllowed || slices.ContainsFunc(c.node.Addrs, r.Contains)
	}
	if nodeAllowed {
		for _, a := range sp.LoadBalancerIPs {
			if c.cfg.addrInFamily(a) {
				sources = append(sources, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	for _, r := range disjoint(sources) {
		el := m.Element{Key: append(slices.Clip(key), m.A(r.Addr()))}
		if r.Bits() < r.Addr().BitLen() {
			el.KeyEnd = append(slices.Clip(key), m.A(m.LastAddr(r)))
		}
		p.elements = append(p.elements, keyedElement{c.firewallAllow, el})
	}
}

// disjoint sorts prefixes and drops each one another holds: the kernel
// refuses overlapping ranges under one key. (Two prefixes are nested or
// apart, so the first of a run of nested ones holds the rest.)
func disjoint(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out := ps[:0]
	for _, p := range ps {
		if len(out) > 0 && out[len(out)-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}
