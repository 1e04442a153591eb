package k8s

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// bigTracker holds n services of three endpoints each.
func bigTracker(b *testing.B, n int) *Tracker {
	tr := NewTracker(nil, TrackerOptions{})
	tr.ReplaceAll(bigObjects(n))
	if got := len(tr.Snapshot().Services); got != n {
		b.Fatalf("%d services, want %d", got, n)
	}
	return tr
}

// bigObjects makes n services of three endpoints each, new objects each call.
func bigObjects(n int) ([]*v1.Service, []*discoveryv1.EndpointSlice, *v1.Node) {
	var services []*v1.Service
	var eps []*discoveryv1.EndpointSlice
	for i := range n {
		name := fmt.Sprintf("svc-%05d", i)
		services = append(services, svc("default", name, withClusterIPs(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1))))
		eps = append(eps, slice("default", name+"-1", name, discoveryv1.AddressTypeIPv4,
			ep(fmt.Sprintf("10.244.%d.%d", i/80, i%80*3+1)), ep(fmt.Sprintf("10.244.%d.%d", i/80, i%80*3+2)),
			ep(fmt.Sprintf("10.244.%d.%d", i/80, i%80*3+3))))
	}
	return services, eps, nil
}

// BenchmarkSnapshotAfterEndpointChange is the tracker's share of one
// endpoint update at 10,000 services.
func BenchmarkSnapshotAfterEndpointChange(b *testing.B) {
	tr := bigTracker(b, 10000)
	for i := 0; b.Loop(); i++ {
		tr.SetSlice(slice("default", "svc-00042-1", "svc-00042", discoveryv1.AddressTypeIPv4,
			ep("10.250.0.1"), ep(fmt.Sprintf("10.250.%d.%d", i/200%200, i%200+1))))
		_ = tr.Snapshot()
	}
}

// BenchmarkReplaceAllUnchanged is a manifest reload of 10,000 unchanged
// services and slices.
func BenchmarkReplaceAllUnchanged(b *testing.B) {
	tr := bigTracker(b, 10000)
	services, eps, nodes := bigObjects(10000)
	for b.Loop() {
		tr.ReplaceAll(services, eps, nodes)
	}
}
