package proxier

import (
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
)

// noLocal tells which Local traffic policy of a service port finds no local
// endpoint while the service has endpoints: that traffic is dropped.
type noLocal struct{ internal, external bool }

// noLocalOf decides it for one family as kube-proxy counts
// sync_proxy_rules_no_local_endpoints_total: only services of the family
// (a ClusterIP in it) with usable endpoints somewhere, by policy.
func noLocalOf(sp *k8s.ServicePort, node *k8s.Node, cfg Config) noLocal {
	// Without a Local policy there is nothing to count: the endpoints,
	// thousands for a wide service, need no choosing.
	if !sp.InternalPolicyLocal && !sp.ExternalPolicyLocal || !slices.ContainsFunc(sp.ClusterIPs, cfg.addrInFamily) {
		return noLocal{}
	}
	choice := chooseEndpoints(sp, node, func(e *k8s.Endpoint) bool { return cfg.addrInFamily(e.Addr) })
	return noLocalFrom(sp, len(choice.cluster), len(choice.local))
}

// noLocalFrom decides it from the lengths of a port's endpoint lists.
func noLocalFrom(sp *k8s.ServicePort, cluster, local int) noLocal {
	if cluster == 0 || local > 0 {
		return noLocal{}
	}
	return noLocal{internal: sp.InternalPolicyLocal, external: sp.ExternalPolicyLocal}
}

// patchedNoLocal decides it for a port that state's last update patched,
// from its lists' lengths (no choosing of thousands of endpoints); false
// when the port was not patched.
func patchedNoLocal(state *incremental, sp *k8s.ServicePort, cfg Config) (noLocal, bool) {
	if state == nil || !sp.InternalPolicyLocal && !sp.ExternalPolicyLocal || !slices.ContainsFunc(sp.ClusterIPs, cfg.addrInFamily) {
		return noLocal{}, false
	}
	kept, ok := state.wide[sp.Name]
	if !ok || kept.sp != sp || kept.w == nil {
		return noLocal{}, false
	}
	return noLocalFrom(sp, len(kept.w.tabs[0].keys), len(kept.w.tabs[1].keys)), true
}

// noLocalCounts keeps the counts of one family along the syncs, at the
// cost of the service ports that changed.
type noLocalCounts struct {
	ports              map[k8s.ServicePortName]noLocal // only those with a flag set
	internal, external int
}

func (c *noLocalCounts) set(name k8s.ServicePortName, v noLocal) {
	if c.ports == nil {
		c.ports = map[k8s.ServicePortName]noLocal{}
	}
	old := c.ports[name]
	c.internal += boolInt(v.internal) - boolInt(old.internal)
	c.external += boolInt(v.external) - boolInt(old.external)
	if v == (noLocal{}) {
		delete(c.ports, name)
	} else {
		c.ports[name] = v
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
