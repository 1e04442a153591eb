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

// chooseEndpoints picks the endpoints of the compiled family: ready ones,
// or, when none is ready, serving ones that are terminating (separately for
// the cluster-wide and the local choice). Topology hints narrow the cluster
// choice when every endpoint carries them and some match this node.
func chooseEndpoints(sp *k8s.ServicePort, node *k8s.Node, inFamily func(*k8s.Endpoint) bool) endpointChoice {
	eps := sp.Endpoints
	if !allOf(eps, inFamily) {
		eps = nil
		for i := range sp.Endpoints {
			if inFamily(&sp.Endpoints[i]) {
				eps = append(eps, sp.Endpoints[i])
			}
		}
	}
	return endpointChoice{
		cluster: usable(eps, topologyFilter(eps, node)),
		local:   usable(eps, isLocal(node)),
	}
}

// isLocal keeps the endpoints on node.
func isLocal(node *k8s.Node) func(*k8s.Endpoint) bool {
	return func(e *k8s.Endpoint) bool { return node.Name != "" && e.NodeName == node.Name }
}

// inChoice is the rule of an endpoint list, here and for the lists a delta
// patches (patch.go): an endpoint keep keeps is in it when it is ready, or,
// when none it keeps is ready (anyReady false), serving and terminating.
func inChoice(e *k8s.Endpoint, keep func(*k8s.Endpoint) bool, anyReady bool) bool {
	switch {
	case !keep(e):
		return false
	case anyReady:
		return e.Ready
	}
	return !e.Ready && e.Serving && e.Terminating
}

// usable is the list of eps that keep keeps, by inChoice.
func usable(eps []k8s.Endpoint, keep func(*k8s.Endpoint) bool) []k8s.Endpoint {
	// The common case, every endpoint kept and ready, needs no copy.
	if allOf(eps, func(e *k8s.Endpoint) bool { return e.Ready && keep(e) }) {
		return eps
	}
	// Counted first: a wide service's local list is allocated once.
	nReady := 0
	for i := range eps {
		if eps[i].Ready && keep(&eps[i]) {
			nReady++
		}
	}
	var out []k8s.Endpoint
	if nReady > 0 {
		out = make([]k8s.Endpoint, 0, nReady)
	}
	for i := range eps {
		if inChoice(&eps[i], keep, nReady > 0) {
			out = append(out, eps[i])
		}
	}
	return out
}

// topologyFilter returns which endpoints topology hints keep, as kube-proxy
// does. The hints decide, not the service's trafficDistribution: the
// topology-mode annotation gets zone hints written without it. The endpoints
// hinted for this node when every ready endpoint has node hints and one names
// this node; else those hinted for this node's zone when every ready endpoint
// has zone hints and one names the zone; else every endpoint.
func topologyFilter(eps []k8s.Endpoint, node *k8s.Node) func(*k8s.Endpoint) bool {
	forNode := func(e *k8s.Endpoint) bool { return slices.Contains(e.NodeHints(), node.Name) }
	if node.Name != "" && hintsMatch(eps, (*k8s.Endpoint).NodeHints, forNode) {
		return forNode
	}
	inZone := func(e *k8s.Endpoint) bool { return slices.Contains(e.ZoneHints(), node.Zone) }
	if node.Zone != "" && hintsMatch(eps, (*k8s.Endpoint).ZoneHints, inZone) {
		return inZone
	}
	return func(*k8s.Endpoint) bool { return true }
}

// hintsMatch tells whether every ready endpoint has hints of one kind and
// at least one of them matches.
func hintsMatch(eps []k8s.Endpoint, hints func(*k8s.Endpoint) []string, match func(*k8s.Endpoint) bool) bool {
	found := false
	for i := range eps {
		e := &eps[i]
		if !e.Ready {
			continue
		}
		if len(hints(e)) == 0 {
			return false
		}
		found = found || match(e)
	}
	return found
}

// allOf tells whether f holds for every endpoint; by pointer, as the
// endpoints are large and a wide service has thousands.
func allOf(eps []k8s.Endpoint, f func(*k8s.Endpoint) bool) bool {
	for i := range eps {
		if !f(&eps[i]) {
			return false
		}
	}
	return true
}
