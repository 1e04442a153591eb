package k8s

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// conflictSvc is a service of one port 80 on the given cluster IP and
// external IPs, created at the given second (0: no timestamp).
func conflictSvc(name string, created int64, ip string, ext ...string) *v1.Service {
	return svc("default", name, withClusterIPs(ip), func(s *v1.Service) {
		s.Spec.ExternalIPs = ext
		if created != 0 {
			s.CreationTimestamp = metav1.NewTime(time.Unix(created, 0))
		}
	})
}

// skippedNames lists the services left out for a conflict.
func skippedNames(tr *Tracker) []string {
	var out []string
	for _, e := range tr.Skipped() {
		if errors.Is(e, ErrConflict) {
			out = append(out, e.Name)
		}
	}
	return out
}

// TestConflictsAcrossChanges: conflicts come and go over a sequence of
// changes; after each, the ports kept and the ones skipped.
func TestConflictsAcrossChanges(t *testing.T) {
	tests := []struct {
		name  string
		steps []func(*Tracker)
		want  [][]string // skipped after each step
	}{{
		name: "winner kept, loser reported, loser wins after the winner goes",
		steps: []func(*Tracker){
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 1, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("b", 2, "10.96.0.1")) },
			func(tr *Tracker) { tr.DeleteService("default", "a") },
		},
		want: [][]string{nil, {"b"}, nil},
	}, {
		name: "an older service coming takes the key over",
		steps: []func(*Tracker){
			func(tr *Tracker) { tr.SetService(conflictSvc("b", 2, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 1, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 1, "10.96.0.2")) },
		},
		want: [][]string{nil, {"b"}, nil},
	}, {
		name: "a chain: the loser of one key leaves the next to a third",
		steps: []func(*Tracker){
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 1, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("b", 2, "10.96.0.2", "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("c", 3, "10.96.0.2")) },
			func(tr *Tracker) { tr.DeleteService("default", "a") },
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 4, "10.96.0.1")) },
		},
		want: [][]string{nil, {"b"}, {"b"}, {"c"}, {"a", "c"}},
	}, {
		name: "no timestamp loses; equally old: the first name wins",
		steps: []func(*Tracker){
			func(tr *Tracker) { tr.SetService(conflictSvc("a", 0, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("z", 5, "10.96.0.1")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("y", 5, "10.96.0.1")) },
			func(tr *Tracker) { tr.DeleteService("default", "y") },
		},
		want: [][]string{nil, {"a"}, {"a", "z"}, {"a"}},
	}, {
		name: "a conflict elsewhere does not move this one",
		steps: []func(*Tracker){
			func(tr *Tracker) {
				tr.ReplaceAll([]*v1.Service{conflictSvc("a", 1, "10.96.0.1"), conflictSvc("b", 2, "10.96.0.1")}, nil, nil)
			},
			func(tr *Tracker) { tr.SetService(conflictSvc("c", 1, "10.96.0.9")) },
			func(tr *Tracker) { tr.SetService(conflictSvc("d", 2, "10.96.0.9")) },
			func(tr *Tracker) { tr.DeleteService("default", "c") },
		},
		want: [][]string{{"b"}, {"b"}, {"b", "d"}, {"b"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(nil, TrackerOptions{})
			for i, step := range tt.steps {
				step(tr)
				if diff := cmp.Diff(tt.want[i], skippedNames(tr)); diff != "" {
					t.Errorf("step %d: skipped (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

// TestConflictsAsIfFromScratch: over random changes to few services on few
// addresses and node ports, some batched, the conflicts kept are always
// those a check of all services finds.
func TestConflictsAsIfFromScratch(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 3))
		tr := NewTracker(nil, TrackerOptions{})
		for step := range 300 {
			tr.Edit(func(e *Editor) {
				for range 1 + r.IntN(3) {
					name := fmt.Sprintf("svc-%d", r.IntN(10))
					if r.IntN(4) == 0 {
						e.DeleteService("default", name)
						continue
					}
					e.SetService(randomConflictSvc(r, name))
				}
			})
			got := skippedNames(tr)
			tr.mu.Lock()
			var all []string
			for _, c := range tr.findConflicts(slices.Collect(func(yield func(k types.NamespacedName) bool) {
				for k, e := range tr.services {
					if len(e.ports) > 0 && !yield(k) {
						return
					}
				}
			})) {
				all = append(all, c.err.Error())
			}
			tr.mu.Unlock()
			var have []string
			for _, e := range tr.Skipped() {
				if errors.Is(e, ErrConflict) {
					have = append(have, e.Error())
				}
			}
			slices.Sort(all)
			if diff := cmp.Diff(all, have); diff != "" {
				t.Fatalf("seed %d step %d (skipped %v): conflicts (-from scratch +kept):\n%s", seed, step, got, diff)
			}
		}
	}
}

// randomConflictSvc makes a service of one or two ports on few addresses
// and node ports, of one of few ages.
func randomConflictSvc(r *rand.Rand, name string) *v1.Service {
	ip := func() string { return fmt.Sprintf("10.96.0.%d", 1+r.IntN(4)) }
	s := conflictSvc(name, int64(r.IntN(3)), ip())
	if r.IntN(3) == 0 {
		s.Spec.ExternalIPs = []string{ip()}
	}
	if r.IntN(2) == 0 {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "alt", Port: int32(80 + r.IntN(2)), Protocol: v1.ProtocolTCP})
	}
	if r.IntN(2) == 0 {
		s.Spec.Type = v1.ServiceTypeNodePort
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = int32(30000 + r.IntN(3))
		}
	}
	return s
}
