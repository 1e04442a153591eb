package proxier

import (
	"slices"

	"github.com/nftproxy/nftproxy/k8s"
)

// sameServicePort tells whether two service ports compile alike. The
// tracker hands out the same endpoint slice for a service whose endpoints did
// not change, so the common case costs a pointer comparison.
func sameServicePort(a, b *k8s.ServicePort) bool {
	return sameServiceFields(a, b) && sameEndpoints(a.Endpoints, b.Endpoints)
}

// sameServiceFields compares everything but the endpoints.
func sameServiceFields(a, b *k8s.ServicePort) bool {
	return a.Name == b.Name && a.Port == b.Port && a.NodePort == b.NodePort &&
		a.ExternalPolicyLocal == b.ExternalPolicyLocal && a.InternalPolicyLocal == b.InternalPolicyLocal &&
		a.HealthCheckNodePort == b.HealthCheckNodePort && a.AffinityTimeout == b.AffinityTimeout &&
		a.TrafficDistribution == b.TrafficDistribution &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) && slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges)
}

func sameEndpoints(a, b []k8s.Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	for i := range a {
		if !a[i].Equal(&b[i]) {
			return false
		}
	}
	return true
}
