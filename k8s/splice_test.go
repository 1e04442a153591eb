package k8s

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPatchedMergeEqualsFullMerge changes one slice of a two-port service at
// a time, at random, mostly with a read between changes: endpoints
// replaced, added, removed, made not ready, the same address in two slices
// (whose tie only the full merge breaks), slices added and deleted. After each change the service's ports must be
// what merging every slice again gives.
func TestPatchedMergeEqualsFullMerge(t *testing.T) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "wide"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	slice := func(i int, version int) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("wide-%d", i), ResourceVersion: fmt.Sprint(version),
				Labels: map[string]string{discoveryv1.LabelServiceName: "wide"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)},
				{Name: ptr("dns"), Port: ptr[int32](5353), Protocol: ptr(v1.ProtocolUDP)}},
		}
		// Mostly the slice's own range of addresses, now and then one of
		// the next slice's: a duplicate.
		for j := range 4 + rng.IntN(6) {
			host := 10*i + j
			if rng.IntN(60) == 0 {
				host = 10*(i+1) + rng.IntN(4)
			}
			ready := rng.IntN(5) > 0
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", host/250, host%250)},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready}})
		}
		return s
	}
	tr := NewTracker(nil, TrackerOptions{FallbackNode: Node{Name: "node-1"}})
	var slices []*discoveryv1.EndpointSlice
	for i := range 6 {
		slices = append(slices, slice(i, 1))
	}
	tr.ReplaceAll([]*v1.Service{svc}, slices, nil)
	key := keyOf("default", "wide")
	patched := 0
	for step := range 400 {
		// A read makes the next change splice; without one between them
		// (one in four), the second change of an interval drops the list
		// for a merge at the next read.
		if rng.IntN(4) > 0 {
			tr.TakeChanges()
		}
		i := rng.IntN(7)
		if rng.IntN(6) == 0 {
			tr.DeleteSlice("default", fmt.Sprintf("wide-%d", i))
		} else {
			tr.SetSlice(slice(i, step+2))
		}
		tr.mu.Lock()
		if _, ok := tr.merged[key]; ok {
			patched++
		}
		want := WithEndpoints(tr.services[key].ports, tr.slicesOf(key))
		got := tr.mergedOf(key)
		tr.mu.Unlock()
		if d := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); d != "" {
			t.Fatalf("step %d (-full merge +patched):\n%s", step, d)
		}
	}
	// Both ways must have been taken, or the test proves nothing.
	t.Logf("%d of 400 changes patched", patched)
	if patched < 100 || patched > 350 {
		t.Errorf("%d of 400 changes patched; want most, not all (duplicates fall back)", patched)
	}
}

func TestSpliceEndpoints(t *testing.T) {
	ep := func(hosts ...int) []Endpoint {
		var out []Endpoint
		for _, h := range hosts {
			out = append(out, Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(h)}), Port: 80, Ready: true})
		}
		return out
	}
	tests := []struct {
		name                   string
		merged, removed, added []Endpoint
		want                   []Endpoint
		ok                     bool
	}{
		{"replaced in the middle", ep(1, 2, 3), ep(2), ep(4), ep(1, 3, 4), true},
		{"the same one again", ep(1, 2, 3), ep(2), ep(2), ep(1, 2, 3), true},
		{"added in front and at the end", ep(2, 3), nil, ep(1, 4), ep(1, 2, 3, 4), true},
		{"all removed", ep(1, 2), ep(1, 2), nil, nil, true},
		{"into none", nil, nil, ep(5), ep(5), true},
		{"nothing", ep(1), nil, nil, ep(1), true},
		{"removed but not there", ep(1, 3), ep(2), nil, nil, false},
		{"added but there already", ep(1, 2), nil, ep(2), nil, false},
		{"twice in the slice", ep(1), nil, ep(2, 2), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := spliceEndpoints(tt.merged, tt.removed, tt.added)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if d := cmp.Diff(tt.want, got, cmpopts.EquateComparable(netip.Addr{})); ok && d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
