package proxier

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// recordingKernel records what the proxier asks of the kernel. It checks no
// semantics of its own: the netlink applier's kernel tests do that.
type recordingKernel struct {
	calls      []string
	fail       error
	failFamily string // when set ("ip", "ip6"), fail concerns this family only
	gen        uint32 // incremented by each successful batch, like the kernel's
}

func (k *recordingKernel) failing(f m.Family) error {
	if k.failFamily != "" && f.String() != k.failFamily {
		return nil
	}
	return k.fail
}

func (k *recordingKernel) Generation() (uint32, error) { return k.gen, nil }

func (k *recordingKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	k.calls = append(k.calls, "full "+rs.Family.String())
	err := k.failing(rs.Family)
	if err == nil {
		k.gen++
	}
	return m.Stats{Messages: 100}, err
}

func (k *recordingKernel) ApplyChanges(f m.Family, _ string, c *m.Changes) (m.Stats, error) {
	k.calls = append(k.calls, "delta "+f.String())
	err := k.failing(f)
	if err == nil {
		k.gen++
	}
	return m.Stats{Messages: 4}, err
}

func TestSyncFullThenDelta(t *testing.T) {
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig}, Kernel: k})
	ctx := context.Background()
	one := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	two := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3)}}
	zoned := &k8s.Snapshot{Services: two.Services, Node: k8s.Node{Name: "node-1", Zone: "b"}}
	unsorted := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3), svc("api", "http", "10.96.0.11", 1)}}

	steps := []struct {
		name string
		snap *k8s.Snapshot
		full bool
		fail error
		want []string
	}{
		{name: "first sync is full", snap: one, want: []string{"full ip"}},
		{name: "no change sends nothing", snap: one},
		{name: "endpoint change is a delta", snap: two, want: []string{"delta ip"}},
		{name: "failed delta", snap: one, fail: errors.New("ENOBUFS"), want: []string{"delta ip"}},
		{name: "after a failure the sync is full", snap: one, want: []string{"full ip"}},
		{name: "forced full sync", snap: one, full: true, want: []string{"full ip"}},
		{name: "endpoint change after a full sync is a delta", snap: two, want: []string{"delta ip"}},
		// The endpoint choice depends on the node: everything is compiled again.
		{name: "node change is full", snap: zoned, want: []string{"full ip"}},
		// Only sorted snapshots can be walked beside the applied state.
		{name: "unsorted snapshot is full", snap: unsorted, want: []string{"full ip"}},
	}
	for _, st := range steps {
		k.calls, k.fail = nil, st.fail
		err := p.Sync(ctx, st.snap, st.full)
		if (err != nil) != (st.fail != nil) {
			t.Fatalf("%s: Sync error = %v, want failure %v", st.name, err, st.fail != nil)
		}
		if len(k.calls) != len(st.want) || (len(st.want) > 0 && k.calls[0] != st.want[0]) {
			t.Errorf("%s: kernel calls %v, want %v", st.name, k.calls, st.want)
		}
	}
}

// TestSyncFailureInOneFamily: when the second family's batch fails, the
// first family's table already holds the new snapshot (here: unchanged, as
// the service has no IPv6 address) while the proxier's
// last snapshot, which the next diff starts from, is the old one; so both
// families sync in full next.
func TestSyncFailureInOneFamily(t *testing.T) {
	k := &recordingKernel{}
	v6 := Config{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}}
	p := New(Options{Configs: []Config{v6, testConfig}, Kernel: k})
	ctx := context.Background()
	one := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	two := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3)}}
	if err := p.Sync(ctx, one, false); err != nil {
		t.Fatal(err)
	}
	k.calls, k.fail, k.failFamily = nil, errors.New("EBUSY"), "ip"
	if err := p.Sync(ctx, two, false); err == nil {
		t.Fatal("Sync succeeded with a failing ip batch")
	}
	k.calls, k.fail = nil, nil
	if err := p.Sync(ctx, two, false); err != nil {
		t.Fatal(err)
	}
	if want := []string{"full ip6", "full ip"}; !slices.Equal(k.calls, want) {
		t.Errorf("after a failure in ip: kernel calls %v, want %v", k.calls, want)
	}
}

func TestDiffSnapshots(t *testing.T) {
	a := svc("a", "http", "10.96.0.10", 2)
	b := svc("b", "http", "10.96.0.11", 1)
	b2 := svc("b", "http", "10.96.0.11", 2)
	c := svc("c", "http", "10.96.0.12", 1, nodePort(30000))
	prev := &k8s.Snapshot{Services: []k8s.ServicePort{a, b}}
	next := &k8s.Snapshot{Services: []k8s.ServicePort{b2, c}}
	d, sorted := diffSnapshots(prev, next)
	// a removed, c added; b's endpoints and c's endpoints changed.
	if !sorted || d.serviceChanges != 2 || d.endpointChanges != 2 || len(d.ports) != 3 {
		t.Errorf("diffSnapshots = %d services, %d endpoints, %d ports, sorted %v; want 2, 2, 3, true",
			d.serviceChanges, d.endpointChanges, len(d.ports), sorted)
	}
	if _, sorted := diffSnapshots(nil, &k8s.Snapshot{Services: []k8s.ServicePort{b, a}}); sorted {
		t.Error("diffSnapshots took an unsorted snapshot")
	}
}

// TestResyncSkippedWhileNothingCommitted: a periodic resync is needed only
// when some nftables commit happened since the last sync (the generation
// moved); a sync whose batches were not the only commits leaves it unknown.
func TestResyncSkippedWhileNothingCommitted(t *testing.T) {
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig}, Kernel: k})
	snap := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	if !p.unchanged() {
		t.Error("right after a sync: resync not skipped")
	}
	k.gen++ // someone else committed, maybe to our table
	if p.unchanged() {
		t.Error("after another program's commit: resync skipped")
	}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	if !p.unchanged() {
		t.Error("after the repairing sync: resync not skipped")
	}
	// A commit of someone else during the sync: the kernel may not hold
	// what the sync sent.
	racing := &racingKernel{recordingKernel: k}
	p.opts.Kernel = racing
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	if p.unchanged() {
		t.Error("after a sync with a concurrent commit: resync skipped")
	}
	k.fail = errors.New("ENOMEM")
	_ = p.Sync(context.Background(), snap, true)
	if p.unchanged() {
		t.Error("after a failed sync: resync skipped")
	}
}

// racingKernel commits once more, as another program would, in every
// batch it is given.
type racingKernel struct{ *recordingKernel }

func (k *racingKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	k.gen++
	return k.recordingKernel.Apply(rs)
}
