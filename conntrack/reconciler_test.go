package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nftproxy/nftproxy/k8s"
	"golang.org/x/sys/unix"
)

var cmpAddrPort = cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })

// racyTable removes the flows in gone from the table right before the
// reconciler deletes them, as another program would.
type racyTable struct {
	*FakeTable
	gone []Flow
}

func (t *racyTable) Delete(ctx context.Context, f Flow) error {
	if slices.Contains(t.gone, f) {
		if err := t.FakeTable.Delete(ctx, f); err != nil {
			return err
		}
		// What netlink returns: the bare errno, wrapped.
		return &netErr{unix.ENOENT}
	}
	return t.FakeTable.Delete(ctx, f)
}

type netErr struct{ err error }

func (e *netErr) Error() string { return "netlink receive: " + e.err.Error() }
func (e *netErr) Unwrap() error { return e.err }

func TestReconcile(t *testing.T) {
	e1, e2 := ep("10.244.1.5", 5353), ep("10.244.2.6", 5353)
	dns := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.UDP, "10.96.0.10", 53, eps...) }
	stale1 := udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")
	stale2 := udp("10.0.0.2:40000", "10.96.0.10:53", "10.244.1.5:5353")
	good := udp("10.0.0.3:40000", "10.96.0.10:53", "10.244.2.6:5353")
	tcp := flow(protoTCP, "10.0.0.4:40000", "10.96.0.10:53", "10.244.1.5:5353")
	all := []Flow{stale1, good, stale2, tcp}

	tests := []struct {
		name        string
		prev, next  *k8s.Snapshot
		table       func(*FakeTable) Table
		want        Result
		wantErr     error
		wantDeleted []Flow
	}{{
		name:        "deletes stale flows only",
		prev:        snap(dns(e1, e2)),
		next:        snap(dns(e2)),
		want:        Result{Dumped: 4, Stale: 2, Deleted: 2},
		wantDeleted: []Flow{stale1, stale2},
	}, {
		name: "ENOENT is not an error",
		prev: snap(dns(e1, e2)),
		next: snap(dns(e2)),
		table: func(f *FakeTable) Table {
			return &racyTable{FakeTable: f, gone: []Flow{stale1}}
		},
		want:        Result{Dumped: 4, Stale: 2, Deleted: 1, Gone: 1},
		wantDeleted: []Flow{stale1, stale2}, // stale1 by the "other program"
	}, {
		name:        "no change that can leave stale flows: no dump",
		prev:        snap(dns(e1)),
		next:        snap(dns(e1, e2)),
		table:       func(f *FakeTable) Table { f.DumpErr = errors.New("must not dump"); return f },
		want:        Result{Skipped: true},
		wantDeleted: nil,
	}, {
		name:    "dump failure",
		prev:    snap(dns(e1, e2)),
		next:    snap(dns(e2)),
		table:   func(f *FakeTable) Table { f.DumpErr = unix.ENOBUFS; return f },
		wantErr: unix.ENOBUFS,
	}, {
		name:    "delete failure is reported, the other deletions go on",
		prev:    snap(dns(e1, e2)),
		next:    snap(dns(e2)),
		table:   func(f *FakeTable) Table { f.DeleteErr = unix.EPERM; return f },
		want:    Result{Dumped: 4, Stale: 2, Failed: 2},
		wantErr: unix.EPERM,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &FakeTable{Flows: slices.Clone(all)}
			var table Table = fake
			if tt.table != nil {
				table = tt.table(fake)
			}
			got, err := NewReconciler(table).Reconcile(context.Background(), tt.prev, tt.next)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("Reconcile() error = %v, want %v", err, tt.wantErr)
			}
			if got.Duration <= 0 {
				t.Errorf("Duration = %v, want > 0", got.Duration)
			}
			got.Duration = 0
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Result mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantDeleted, fake.Deleted, cmpAddrPort); diff != "" {
				t.Errorf("deleted flows mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReconcileRetry checks that a failed call is covered by the next one:
// its prev stays the reference until a call succeeds.
func TestReconcileRetry(t *testing.T) {
	e1, e2, e3 := ep("10.244.1.5", 5353), ep("10.244.2.6", 5353), ep("10.244.3.7", 5353)
	dns := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.UDP, "10.96.0.10", 53, eps...) }
	gone := svc("gone", k8s.UDP, "10.96.0.11", 53, e3)
	empty := svc("empty", k8s.UDP, "10.96.0.12", 53)
	staleEP := udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")
	staleSvc := udp("10.0.0.2:40000", "10.96.0.11:53", "10.244.3.7:5353")
	rejected := udp("10.0.0.3:40000", "10.96.0.12:53", "")
	keep := udp("10.0.0.4:40000", "10.96.0.10:53", "10.244.2.6:5353")
	fake := &FakeTable{Flows: []Flow{staleEP, staleSvc, rejected, keep}, DumpErr: unix.ENOBUFS}
	r := NewReconciler(fake)
	ctx := context.Background()

	s0 := snap(dns(e1, e2), gone, empty)
	s1 := snap(dns(e2), svc("empty", k8s.UDP, "10.96.0.12", 53, e3)) // endpoint and service gone, empty got one
	if _, err := r.Reconcile(ctx, s0, s1); !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("first Reconcile() error = %v, want ENOBUFS", err)
	}
	fake.DumpErr = nil
	// Seen alone, s1 → s2 changes nothing; the reconciler must still use s0.
	s2 := snap(dns(e2), svc("empty", k8s.UDP, "10.96.0.12", 53, e3))
	res, err := r.Reconcile(ctx, s1, s2)
	if err != nil {
		t.Fatalf("second Reconcile() error = %v", err)
	}
	if res.Deleted != 3 {
		t.Errorf("second Reconcile() deleted %d flows, want 3", res.Deleted)
	}
	if diff := cmp.Diff([]Flow{staleEP, staleSvc, rejected}, fake.Deleted, cmpAddrPort); diff != "" {
		t.Errorf("deleted flows mismatch (-want +got):\n%s", diff)
	}
	// After success the caller's prev is the reference again.
	res, err = r.Reconcile(ctx, s2, s2)
	if err != nil || !res.Skipped {
		t.Errorf("third Reconcile() = %+v, %v; want skipped", res, err)
	}
}

func TestReconcileFirstSync(t *testing.T) {
	fake := &FakeTable{Flows: []Flow{
		udp("10.0.0.1:40000", "10.96.0.10:53", ""),
		udp("10.0.0.2:40000", "10.96.0.10:53", "10.244.1.5:5353"),
	}}
	next := snap(svc("dns", k8s.UDP, "10.96.0.10", 53, ep("10.244.1.5", 5353)))
	res, err := NewReconciler(fake).Reconcile(context.Background(), nil, next)
	if err != nil || res.Deleted != 1 {
		t.Fatalf("Reconcile() = %+v, %v; want 1 deleted", res, err)
	}
	if len(fake.Flows) != 1 || fake.Flows[0].DNAT() != true {
		t.Errorf("flows left = %v, want the DNATed one", fake.Flows)
	}
}

func TestReconcileCanceled(t *testing.T) {
	fake := &FakeTable{Flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := NewReconciler(fake).Reconcile(ctx, snap(svc("dns", k8s.UDP, "10.96.0.10", 53, ep("10.244.1.5", 5353))), snap())
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Reconcile() error = %v, want context.Canceled", err)
	}
	if len(fake.Deleted) != 0 {
		t.Errorf("deleted %v after cancel", fake.Deleted)
	}
}

func TestFakeTableDeleteMissing(t *testing.T) {
	f := &FakeTable{}
	if err := f.Delete(context.Background(), udp("10.0.0.1:1", "10.0.0.2:2", "")); !errors.Is(err, ErrNotExist) {
		t.Errorf("Delete() of a missing flow = %v, want ErrNotExist", err)
	}
}

// BenchmarkReconcile is the whole reconcile of 10,000 flows with 100 stale
// ones against the fake: index, selection and deletions.
func BenchmarkReconcile(b *testing.B) {
	flows, prev, next := benchFlows()
	fake := &FakeTable{}
	r := NewReconciler(fake)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		fake.Flows, fake.Deleted = slices.Clone(flows), fake.Deleted[:0]
		fake.find(fakeKey{}) // build the fake's index: measure the reconciler, not the fake's setup
		b.StartTimer()
		res, err := r.Reconcile(ctx, prev, next)
		if err != nil || res.Deleted != 100 {
			b.Fatalf("Reconcile() = %+v, %v; want 100 deleted", res, err)
		}
	}
}

// TestReconcileRetryPartial: when the calls carry only the service ports
// each sync changed, the retry covers the failed call's ports and its own,
// a service removed by the retrying sync included.
func TestReconcileRetryPartial(t *testing.T) {
	e1, e2, e3 := ep("10.244.1.5", 5353), ep("10.244.2.6", 5353), ep("10.244.3.7", 5353)
	dns := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.UDP, "10.96.0.10", 53, eps...) }
	gone := svc("gone", k8s.UDP, "10.96.0.11", 53, e3)
	staleEP := udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")
	staleSvc := udp("10.0.0.2:40000", "10.96.0.11:53", "10.244.3.7:5353")
	keep := udp("10.0.0.4:40000", "10.96.0.10:53", "10.244.2.6:5353")
	fake := &FakeTable{Flows: []Flow{staleEP, staleSvc, keep}, DumpErr: unix.ENOBUFS}
	r := NewReconciler(fake)
	ctx := context.Background()
	if _, err := r.Reconcile(ctx, snap(dns(e1, e2)), snap(dns(e2))); !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("first Reconcile() error = %v, want ENOBUFS", err)
	}
	fake.DumpErr = nil
	// The retrying sync removed gone; its next is the whole state.
	if _, err := r.Reconcile(ctx, snap(gone), snap(dns(e2))); err != nil {
		t.Fatalf("second Reconcile() error = %v", err)
	}
	if diff := cmp.Diff([]Flow{staleEP, staleSvc}, fake.Deleted, cmpAddrPort); diff != "" {
		t.Errorf("deleted flows mismatch (-want +got):\n%s", diff)
	}
}

// TestReconcileCountsIPv6: the result tells how many of the deleted flows
// were IPv6, for the metrics by ip_family.
func TestReconcileCountsIPv6(t *testing.T) {
	dual := func(eps ...k8s.Endpoint) k8s.ServicePort {
		sp := svc("dns", k8s.UDP, "10.96.0.10", 53, eps...)
		sp.ClusterIPs = append(sp.ClusterIPs, addr("fd00::10"))
		return sp
	}
	e4, e6 := ep("10.244.1.5", 5353), ep("fd00:244::5", 5353)
	table := &FakeTable{Flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"),
		udp("[fd00::1]:40000", "[fd00::10]:53", "[fd00:244::5]:5353"), udp("[fd00::2]:40000", "[fd00::10]:53", "[fd00:244::5]:5353")}}
	res, err := NewReconciler(table).Reconcile(context.Background(), snap(dual(e4, e6)), snap(dual()))
	if err != nil || res.Deleted != 3 || res.DeletedIPv6 != 2 {
		t.Errorf("Reconcile: %+v, %v; want 3 deleted, 2 of them IPv6", res, err)
	}
}
