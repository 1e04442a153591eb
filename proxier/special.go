package proxier

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// serviceChains are the chains of a service port whose semantics the shared
// dispatch can't express: session affinity (a set per endpoint remembers its
// clients) and externalTrafficPolicy Local (outside traffic stays on this
// node, unmasqueraded). Their names are kube-proxy's:
// <kind>-<hash>-<namespace>/<name>/<protocol>/<port>.
type serviceChains struct {
	internal string // ClusterIP traffic (used with affinity)
	external string // NodePort, ExternalIP and load balancer traffic
}

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

// endpointID is an endpoint's readable name part: address/port, with an IPv6
// address's colons as dots (nft names may not hold colons).
func endpointID(e k8s.Endpoint) string {
	return strings.ReplaceAll(e.Addr.String(), ":", ".") + "/" + fmt.Sprint(e.Port)
}

func (c *compiler) serviceChains(p *piece, sp *k8s.ServicePort, choice endpointChoice) *serviceChains {
	id := portID(sp)
	proto := sp.Name.Protocol.Number()
	endpointChains := map[string]string{} // endpointID -> chain
	affinitySets := map[string]string{}
	endpointChain := func(e k8s.Endpoint) string {
		eid := endpointID(e)
		if name, ok := endpointChains[eid]; ok {
			return name
		}
		name := hashName("endpoint", id+"__"+eid)
		ch := &m.Chain{Name: name}
		if sp.AffinityTimeout > 0 {
			set := hashName("affinity", id+"__"+eid)
			affinitySets[eid] = set
			p.sets = append(p.sets, &m.Set{Name: set, Key: []m.DataType{c.addrT}, Timeout: sp.AffinityTimeout})
			ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.UpdateSet{Key: []m.Field{m.FieldSaddr}, Set: set}}})
		}
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.DNAT{Proto: proto, Addr: e.Addr, Port: e.Port}},
			Comment: sp.Name.String()})
		endpointChains[eid] = name
		p.chains = append(p.chains, ch)
		return name
	}
	// pick sends a packet to a client's remembered endpoint, else to a
	// random one; with no endpoints it drops.
	pick := func(eps []k8s.Endpoint) []m.Rule {
		if len(eps) == 0 {
			return []m.Rule{{Exprs: []m.Expr{m.Verdict{Kind: m.Drop}}, Comment: sp.Name.String() + " has no local endpoints"}}
		}
		targets := make([]string, len(eps))
		for i, e := range eps {
			targets[i] = endpointChain(e)
		}
		var rules []m.Rule
		if sp.AffinityTimeout > 0 {
			for i, e := range eps {
				rules = append(rules, m.Rule{Exprs: []m.Expr{m.MatchSet{Key: []m.Field{m.FieldSaddr}, Set: affinitySets[endpointID(e)]},
					m.Verdict{Kind: m.Goto, Chain: targets[i]}}})
			}
		}
		if len(targets) == 1 {
			return append(rules, m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Goto, Chain: targets[0]}}})
		}
		return append(rules, m.Rule{Exprs: []m.Expr{m.NumgenGoto{Chains: targets}}})
	}
	add := func(kind string, rules ...m.Rule) string {
		name := hashName(kind, id)
		// Declared before the endpoint chains they jump to, for readability.
		p.chains = append(p.chains, &m.Chain{Name: name, Rules: rules})
		return name
	}
	out := &serviceChains{}
	masqAll := jump(chainMarkForMasquerade)
	if sp.AffinityTimeout > 0 {
		var rules []m.Rule
		if r, ok := c.clusterMasquerade(); ok {
			rules = append(rules, r)
		}
		out.internal = add("service", append(rules, pick(choice.internal(sp))...)...)
	}
	if !sp.ExternalPolicyLocal {
		out.external = add("external", append([]m.Rule{masqAll}, pick(choice.cluster)...)...)
		return out
	}
	// eTP=Local: pods and the node itself still reach every endpoint (the
	// node's own traffic masqueraded, as its source can't be kept); traffic
	// from elsewhere only local endpoints, with its source kept.
	cluster := add("cluster", pick(choice.cluster)...)
	var rules []m.Rule
	if match, ok := c.localTraffic(false); ok {
		rules = append(rules, m.Rule{Exprs: append(match, m.Verdict{Kind: m.Goto, Chain: cluster}),
			Comment: "pod traffic stays cluster-wide"})
	}
	rules = append(rules,
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}},
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, m.Verdict{Kind: m.Goto, Chain: cluster}}, Comment: "node traffic stays cluster-wide"})
	out.external = add("external", append(rules, pick(choice.local)...)...)
	return out
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
