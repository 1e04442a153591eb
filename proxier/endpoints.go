package proxier

import (
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
)

// endpointChoice is where one service port's traffic may go, kube-proxy's
// way: cluster endpoints for traffic policy Cluster, local ones for Local.
type endpointChoice struct {
	cluster []k8s.Endpoint // usable endpoints, narrowed by topology hints
	local   []k8s.Endpoint // usable endpoints on this node
}

// internal is where in-cluster traffic (to ClusterIPs) goes.
func (e endpointChoice) internal(sp *k8s.ServicePort) []k8s.Endpoint {
	if sp.InternalPolicyLocal {
		return e.local
	}
	return e.cluster
}

// chooseEndpoints picks the endpoints of the compiled family: ready ones,
// or, when none is ready, serving ones that are terminating (separately for
// the cluster-wide and the local choice). Topology hints narrow the cluster
// choice when every endpoint carries them and some match this node.
func chooseEndpoints(sp *k8s.ServicePort, node *k8s.Node, inFamily func(k8s.Endpoint) bool) endpointChoice {
	var eps []k8s.Endpoint
	for _, e := range sp.Endpoints {
		if inFamily(e) {
			eps = append(eps, e)
		}
	}
	isLocal := func(e k8s.Endpoint) bool { return node.Name != "" && e.NodeName == node.Name }
	hinted := topologyFilter(sp.TrafficDistribution, eps, node)
	return endpointChoice{
		cluster: usable(eps, hinted),
		local:   usable(eps, isLocal),
	}
}

func usable(eps []k8s.Endpoint, keep func(k8s.Endpoint) bool) []k8s.Endpoint {
	var ready, terminating []k8s.Endpoint
	for _, e := range eps {
		switch {
		case !keep(e):
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			terminating = append(terminating, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

// topologyFilter returns which endpoints traffic distribution keeps, as
// kube-proxy does: with PreferSameNode the endpoints hinted for this node if
// any; otherwise (PreferClose, PreferSameZone, or no node hints) those hinted
// for this node's zone, but only when every ready endpoint has zone hints and
// at least one names this zone. Anything else keeps every endpoint.
func topologyFilter(distribution string, eps []k8s.Endpoint, node *k8s.Node) func(k8s.Endpoint) bool {
	all := func(k8s.Endpoint) bool { return true }
	if distribution == "" {
		return all
	}
	if distribution == "PreferSameNode" && node.Name != "" {
		forNode := func(e k8s.Endpoint) bool { return slices.Contains(e.NodeHints, node.Name) }
		if slices.ContainsFunc(eps, func(e k8s.Endpoint) bool { return e.Ready && forNode(e) }) {
			return forNode
		}
	}
	if node.Zone == "" {
		return all
	}
	inZone := func(e k8s.Endpoint) bool { return slices.Contains(e.ZoneHints, node.Zone) }
	found := false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		if len(e.ZoneHints) == 0 {
			return all
		}
		found = found || inZone(e)
	}
	if !found {
		return all
	}
	return inZone
}
