package k8s

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// changedNames lists the ports of ch, "name" for a current one and
// "-name" for a gone one, sorted.
func changedNames(ch Changes) []string {
	var out []string
	for name, sp := range ch.Ports {
		s := name.String()
		if sp == nil {
			s = "-" + s
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// TestTakeChangesListsWhatChanged: each hand-over lists the service ports
// that changed since the previous one, and only those.
func TestTakeChangesListsWhatChanged(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	older := svc("default", "zz-older")
	older.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	newer := svc("default", "aa-newer") // same ClusterIP: loses the conflict
	newer.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	other := svc("default", "other", withClusterIPs("10.96.0.11"))
	tr.ReplaceAll([]*v1.Service{older, newer, other},
		[]*discoveryv1.EndpointSlice{slice("default", "other-1", "other", discoveryv1.AddressTypeIPv4, ep("10.244.0.1"))}, nil)
	steps := []struct {
		name   string
		change func()
		want   []string
	}{
		{"start", func() {}, []string{"-default/aa-newer:http", "default/other:http", "default/zz-older:http"}},
		{"nothing", func() {}, nil},
		{"endpoint", func() {
			tr.SetSlice(slice("default", "other-1", "other", discoveryv1.AddressTypeIPv4, ep("10.244.0.2")))
		}, []string{"default/other:http"}},
		{"conflict winner gone", func() { tr.DeleteService("default", "zz-older") },
			[]string{"-default/zz-older:http", "default/aa-newer:http"}},
		{"slice of no service", func() {
			tr.SetSlice(slice("default", "nobody-1", "nobody", discoveryv1.AddressTypeIPv4, ep("10.244.0.3")))
		}, nil},
	}
	for _, st := range steps {
		st.change()
		if diff := cmp.Diff(st.want, changedNames(tr.TakeChanges())); diff != "" {
			t.Errorf("%s: changes (-want +got):\n%s", st.name, diff)
		}
	}
}

// TestTakeChangesFollowSnapshot: over random sequences of service and
// slice events, conflicts among them, the ports handed over, applied one
// hand-over after another, are always the tracker's snapshot.
func TestTakeChangesFollowSnapshot(t *testing.T) {
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 2))
		tr := NewTracker(nil, TrackerOptions{})
		have := map[ServicePortName]*ServicePort{}
		conflicts := 0
		for step := range 200 {
			for range 1 + r.IntN(3) {
				i := r.IntN(8)
				name := fmt.Sprintf("svc-%d", i)
				switch r.IntN(6) {
				case 0:
					tr.DeleteService("default", name)
				case 1:
					tr.DeleteSlice("default", name+"-1")
				case 2, 3:
					// Few addresses and node ports: conflicts come and go.
					s := svc("default", name, withClusterIPs(fmt.Sprintf("10.96.0.%d", 1+r.IntN(5))), func(s *v1.Service) {
						s.CreationTimestamp = metav1.NewTime(time.Unix(int64(r.IntN(3)), 0))
						if r.IntN(2) == 0 {
							s.Spec.Type = v1.ServiceTypeNodePort
							s.Spec.Ports[0].NodePort = int32(30000 + r.IntN(3))
						}
					})
					tr.SetService(s)
				default:
					var eps []discoveryv1.Endpoint
					for n := range r.IntN(4) {
						eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", i, n+1+r.IntN(3))))
					}
					tr.SetSlice(slice("default", name+"-1", name, discoveryv1.AddressTypeIPv4, eps...))
				}
			}
			for name, sp := range tr.TakeChanges().Ports {
				if sp == nil {
					delete(have, name)
				} else {
					have[name] = sp
				}
			}
			var got []string
			for _, sp := range have {
				got = append(got, fmt.Sprint(*sp))
			}
			slices.Sort(got)
			var want []string
			for _, sp := range tr.Snapshot().Services {
				want = append(want, fmt.Sprint(sp))
			}
			slices.Sort(want)
			if len(tr.Skipped()) > 0 {
				conflicts++
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("seed %d step %d: ports handed over differ from the snapshot (-snapshot +changes):\n%s",
					seed, step, strings.TrimSpace(diff))
			}
		}
		if conflicts == 0 {
			t.Errorf("seed %d: no step had a conflict", seed)
		}
	}
}

// TestTakeChangesTriggerTimesAndPending: the hand-over carries the
// last-change-trigger-time of each endpoint change since the previous one,
// later than the tracker's start, as kube-proxy takes them; the pending
// counts are the changes not handed over yet.
func TestTakeChangesTriggerTimesAndPending(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	tr.started = time.Unix(1000, 0)
	web := svc("default", "web")
	at := func(sec int64) func(*discoveryv1.EndpointSlice) {
		return func(s *discoveryv1.EndpointSlice) {
			s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Unix(sec, 0).UTC().Format(time.RFC3339Nano)}
		}
	}
	webSlice := func(addr string, mods ...func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
		s := slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4, ep(addr))
		for _, m := range mods {
			m(s)
		}
		return s
	}
	type pending struct{ services, endpoints uint64 }
	steps := []struct {
		name    string
		change  func()
		pending pending
		want    []time.Time
	}{
		{"service and slice", func() { tr.SetService(web); tr.SetSlice(webSlice("10.244.0.1", at(1001))) },
			pending{1, 1}, []time.Time{time.Unix(1001, 0)}},
		{"nothing", func() {}, pending{}, nil},
		{"two changes", func() {
			tr.SetSlice(webSlice("10.244.0.2", at(1002)))
			tr.SetSlice(webSlice("10.244.0.3", at(1003)))
		}, pending{0, 2}, []time.Time{time.Unix(1002, 0), time.Unix(1003, 0)}},
		{"before the start", func() { tr.SetSlice(webSlice("10.244.0.4", at(999))) }, pending{0, 1}, nil},
		{"no annotation", func() { tr.SetSlice(webSlice("10.244.0.5")) }, pending{0, 1}, nil},
		{"unparsable", func() {
			tr.SetSlice(webSlice("10.244.0.6", func(s *discoveryv1.EndpointSlice) {
				s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday"}
			}))
		}, pending{0, 1}, nil},
		{"annotation alone changed", func() { tr.SetSlice(webSlice("10.244.0.6", at(1010))) }, pending{}, nil},
		// kube-proxy forgets the service's times when a slice is deleted:
		// the deleted slice's annotation tells nothing about the deletion.
		{"changed then deleted", func() {
			tr.SetSlice(webSlice("10.244.0.7", at(1011)))
			tr.DeleteSlice("default", "web-1")
		}, pending{0, 2}, nil},
	}
	for _, st := range steps {
		st.change()
		s, e := tr.Pending()
		if got := (pending{s, e}); got != st.pending {
			t.Errorf("%s: pending %+v, want %+v", st.name, got, st.pending)
		}
		var got []time.Time
		for _, tt := range tr.TakeChanges().TriggerTimes {
			if tt.IPv6 {
				t.Errorf("%s: %v of an IPv4 slice reads as IPv6", st.name, tt.Time)
			}
			got = append(got, tt.Time)
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("%s: trigger times (-want +got):\n%s", st.name, diff)
		}
		if s, e := tr.Pending(); s != 0 || e != 0 {
			t.Errorf("%s: pending %d, %d after the hand-over, want none", st.name, s, e)
		}
	}
}
