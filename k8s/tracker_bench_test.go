package k8s

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		services = append(services, svc("default", name, withClusterIPs(ipv4(10, 96, i/250, i%250+1))))
		eps = append(eps, slice("default", name+"-1", name, discoveryv1.AddressTypeIPv4,
			ep(ipv4(10, 244, i/80, i%80*3+1)), ep(ipv4(10, 244, i/80, i%80*3+2)), ep(ipv4(10, 244, i/80, i%80*3+3))))
	}
	return services, eps, nil
}

// ipv4 formats an address whose third byte may overflow into the second:
// 64,000 services and more run past 10.96.255.x.
func ipv4(a, b, c, d int) string { return fmt.Sprintf("%d.%d.%d.%d", a, b+c/256, c%256, d) }

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

// BenchmarkContestedChange is the tracker's share of a change to a
// service that contests another's address (it comes, taking the address
// over, then goes, handing it back), at 1,000 and 100,000 services: the
// conflict check should cost the contesting services, not all of them.
func BenchmarkContestedChange(b *testing.B) {
	contender := svc("default", "contender", withClusterIPs("10.96.0.43"), func(s *v1.Service) {
		s.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0)) // older than svc-00042: it wins
	})
	loser := ServicePortName{Namespace: "default", Name: "svc-00042", Port: "http", Protocol: TCP}
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			tr := bigTracker(b, n)
			tr.TakeChanges()
			tr.SetService(contender)
			if ch := tr.TakeChanges(); ch.Ports[loser] != nil || len(ch.Ports) != 2 {
				b.Fatalf("contender came: changes %v, want svc-00042 gone and the contender", changedNames(ch))
			}
			tr.DeleteService(contender.Namespace, contender.Name)
			if ch := tr.TakeChanges(); ch.Ports[loser] == nil || len(ch.Ports) != 2 {
				b.Fatalf("contender went: changes %v, want svc-00042 back and the contender gone", changedNames(ch))
			}
			for b.Loop() {
				tr.SetService(contender)
				tr.TakeChanges()
				tr.DeleteService(contender.Namespace, contender.Name)
				tr.TakeChanges()
			}
		})
	}
}
