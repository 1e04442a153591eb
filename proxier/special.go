package proxier

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// portID is the readable part of a service port's chain names.
func portID(sp *k8s.ServicePort) string {
	port := sp.Name.Port
	if port == "" {
		port = fmt.Sprint(sp.Port)
	}
	return fmt.Sprintf("%s/%s/%s/%s", sp.Name.Namespace, sp.Name.Name, strings.ToLower(string(sp.Name.Protocol)), port)
}

// hashName prefixes a readable name with a short hash of it, so names stay
// unique even where the readable part is ambiguous.
func hashName(kind, readable string) string {
	sum := sha256.Sum256([]byte(readable))
	return fmt.Sprintf("%s-%s-%s", kind, base32.StdEncoding.EncodeToString(sum[:])[:8], readable)
}

// firewall lets only loadBalancerSourceRanges reach the load balancer
// address key (and the node itself when one of its addresses is in a range).
func (c *compiler) firewall(p *piece, sp *k8s.ServicePort, key []m.Value) {
	name := hashName("firewall", portID(sp))
	p.elements = append(p.elements, keyedElement{c.firewallIPs, m.Element{Key: key, Comment: sp.Name.String(),
		Verdict: &m.Verdict{Kind: m.Goto, Chain: name}}})
	for _, ch := range p.chains {
		if ch.Name == name {
			return // another load balancer address of the same port
		}
	}
	ch := &m.Chain{Name: name}
	nodeAllowed := false
	for _, r := range sp.LoadBalancerSourceRanges {
		if !c.cfg.inFamily(r) {
			continue
		}
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.MatchPrefix{Field: m.FieldSaddr, Prefix: r.Masked()}, m.Verdict{Kind: m.Return}}})
		for _, a := range c.node.Addrs {
			nodeAllowed = nodeAllowed || r.Contains(a)
		}
	}
	if nodeAllowed {
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, m.Verdict{Kind: m.Return}}})
	}
	ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Drop}}, Comment: sp.Name.String() + " source ranges"})
	p.chains = append(p.chains, ch)
}
