// The shared dispatch chains: one per kind of traffic and endpoint count, DNATing to a random slot.

package proxier

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// sharedObj names a chain service ports share: the dispatch chain of one
// endpoint count for one kind of traffic.
type sharedObj struct {
	kind     sharedKind
	n        int  // endpoint count; the timeout in seconds for affinityUpdate
	local    int  // local endpoint count, for the eTP=Local kinds
	affinity bool // a client's remembered endpoint first (session affinity)
}

// sharedKind orders the shared objects as the ruleset lists them.
type sharedKind uint8

const (
	clusterDispatch sharedKind = iota
	externalDispatch
	nodePortDispatch
	externalLocalDispatch // eTP=Local: external traffic from outside to local endpoints
	nodePortLocalDispatch
	affinityUpdate // remembers a new connection's endpoint for n seconds
)

func compareShared(a, b sharedObj) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), compareBool(a.affinity, b.affinity), cmp.Compare(a.n, b.n), cmp.Compare(a.local, b.local))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case b:
		return -1
	}
	return 1
}

// sharedChainName is the name of a shared object's chain.
func (c *compiler) sharedChainName(o sharedObj) string {
	var name string
	switch o.kind {
	case clusterDispatch:
		name = clusterIPChain(o.n)
	case externalDispatch:
		name = externalChain(o.n)
	case nodePortDispatch:
		name = nodePortChain(o.n)
	case externalLocalDispatch:
		name = externalLocalChain(o.n, o.local)
	case nodePortLocalDispatch:
		name = nodePortLocalChain(o.n, o.local)
	case affinityUpdate:
		return affinityUpdateChain(o.n)
	}
	return affinityName(name, o)
}

// affinityName is a dispatch chain's name with session affinity:
// cluster-ip-affinity-N and so on.
func affinityName(name string, o sharedObj) string {
	if !o.affinity {
		return name
	}
	kind, counts, _ := strings.Cut(name, fmt.Sprintf("-%d", o.n))
	return fmt.Sprintf("%s-affinity-%d%s", kind, o.n, counts)
}

// wideFrom is the endpoint count from which a list's slots go to the wide
// endpoint maps. A rule that reads a map from a chain that did not read it
// yet makes the kernel check every element of the map (kernel 6.18:
// nf_tables_bind_set walks it), so a new endpoint count, whose dispatch chain
// is new, costs the kernel every element of the map it reads. Small counts
// exist in any large cluster; a wide service's counts are its own, and each
// of its scale events makes one. With maps of their own, its new count walks
// only the wide lists' elements, and a service of few endpoints added beside
// wide ones walks only the small lists'. A list crossing wideFrom moves its
// elements from one map to the other: at most wideFrom of them. (A
// variable: tests lower it, so that random sequences cross it.)
var wideFrom = 64

// endpointMap is the endpoint map, small or wide, of a list of n endpoints
// for the map base (the ClusterIP and external one or the NodePort one).
func (c *compiler) endpointMap(base *m.Set, n int) *m.Set {
	switch {
	case n < wideFrom:
		return base
	case base == c.nodePortEndpoints:
		return c.wideNodePortEndpoints
	}
	return c.wideEndpoints
}

// sharedChain builds a dispatch chain: it marks for masquerade as its kind
// of traffic needs, then DNATs to the endpoint in a random one of n slots.
func (c *compiler) sharedChain(o sharedObj) *m.Chain {
	ch := &m.Chain{Name: c.sharedChainName(o)}
	n := uint32(o.n)
	markAll := jump(chainMarkForMasquerade)
	switch o.kind {
	case clusterDispatch:
		if r, ok := c.clusterMasquerade(); ok {
			ch.Rules = append(ch.Rules, r)
		}
		ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.DNATMap{Key: vipKey, Numgen: n, Map: c.endpointMap(c.endpoints, o.n).Name}}})
	case externalDispatch:
		ch.Rules = []m.Rule{markAll, {Exprs: []m.Expr{m.DNATMap{Key: vipKey, Numgen: n, Map: c.endpointMap(c.endpoints, o.n).Name}}}}
	case nodePortDispatch:
		ch.Rules = []m.Rule{markAll, {Exprs: []m.Expr{m.DNATMap{Key: nodePortKey, Numgen: n, Map: c.endpointMap(c.nodePortEndpoints, o.n).Name}}}}
	case externalLocalDispatch:
		ch.Rules = c.localPolicyRules(o, vipKey, c.endpoints)
	case nodePortLocalDispatch:
		ch.Rules = c.localPolicyRules(o, nodePortKey, c.nodePortEndpoints)
	case affinityUpdate:
		for _, proto := range affinityProtocols {
			ch.Rules = append(ch.Rules, m.Rule{Exprs: []m.Expr{m.MatchL4Proto{Proto: proto},
				m.UpdateMap{Key: connKey, Data: connTarget, Map: mapAffinity, Timeout: time.Duration(o.n) * time.Second}}})
		}
	}
	if o.affinity {
		ch.Rules = withAffinityLookups(ch.Rules)
	}
	return ch
}

// localPolicyRules are the rules of an eTP=Local dispatch chain: pods and
// the node itself still reach every endpoint (the node's own traffic
// masqueraded, as its source can't be kept); traffic from elsewhere only
// local endpoints, with its source kept, and none is dropped.
func (c *compiler) localPolicyRules(o sharedObj, key []m.Field, targets *m.Set) []m.Rule {
	cluster := m.DNATMap{Key: key, Numgen: uint32(o.n), Map: c.endpointMap(targets, o.n).Name}
	var rules []m.Rule
	if match, ok := c.localTraffic(false); ok {
		rules = append(rules, m.Rule{Exprs: append(match, cluster), Comment: "pod traffic stays cluster-wide"})
	}
	rules = append(rules,
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, m.Verdict{Kind: m.Jump, Chain: chainMarkForMasquerade}}},
		m.Rule{Exprs: []m.Expr{m.MatchFibSaddrLocal{}, cluster}, Comment: "node traffic stays cluster-wide"})
	if o.local == 0 {
		return append(rules, m.Rule{Exprs: []m.Expr{m.Verdict{Kind: m.Drop}}, Comment: "no local endpoints"})
	}
	local := m.DNATMap{Key: key, Numgen: uint32(o.local), Offset: localSlotOffset, Map: c.endpointMap(targets, o.local).Name}
	return append(rules, m.Rule{Exprs: []m.Expr{local}})
}
