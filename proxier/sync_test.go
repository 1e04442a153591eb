package proxier

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime/debug"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

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
// last ports, which the next diff starts from, are the old ones; so both
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

func TestDiffPorts(t *testing.T) {
	a := svc("a", "http", "10.96.0.10", 2)
	b := svc("b", "http", "10.96.0.11", 1)
	b2 := svc("b", "http", "10.96.0.11", 2)
	c := svc("c", "http", "10.96.0.12", 1, nodePort(30000))
	prev := &k8s.Snapshot{Services: []k8s.ServicePort{a, b}}
	next := &k8s.Snapshot{Services: []k8s.ServicePort{b2, c}}
	d := diffPorts(portsOf(prev), next)
	// a removed, c added; b's endpoints and c's endpoints changed.
	services, endpoints := countChanges(d)
	var names []string
	for _, pc := range d {
		names = append(names, pc.name().Name)
	}
	if services != 2 || endpoints != 2 || !slices.Equal(names, []string{"b", "c", "a"}) {
		t.Errorf("diffPorts = %d services, %d endpoints, ports %v; want 2, 2, [b c a]", services, endpoints, names)
	}
	if d := diffPorts(portsOf(next), next); len(d) != 0 {
		t.Errorf("diffPorts of a snapshot against itself = %d changes", len(d))
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

// modelKernel keeps the ruleset the proxier's batches would leave, per
// family, applying the changes to the model.
type modelKernel struct {
	t      *testing.T
	tables map[m.Family]*m.Ruleset
}

func (k *modelKernel) Generation() (uint32, error) { return 0, nil }

func (k *modelKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	k.tables[rs.Family] = m.Materialized(rs)
	return m.Stats{}, nil
}

func (k *modelKernel) ApplyChanges(f m.Family, _ string, c *m.Changes) (m.Stats, error) {
	k.tables[f] = applyToModel(k.t, k.tables[f], c)
	return m.Stats{}, nil
}

// changesBetween is what a tracker hands over between two snapshots: the
// ports that differ, and some that do not (a tracker may list those too).
func changesBetween(prev, next *k8s.Snapshot) k8s.Changes {
	ch := k8s.Changes{Ports: map[k8s.ServicePortName]*k8s.ServicePort{}, Node: next.Node, ServiceCIDRs: next.ServiceCIDRs}
	for _, pc := range diffPorts(portsOf(prev), next) {
		ch.Ports[pc.name()] = pc.new
	}
	if len(next.Services) > 0 {
		ch.Ports[next.Services[0].Name] = &next.Services[0]
	}
	return ch
}

// TestSyncChangesMatchesCompile: delta syncs from handed-over changes, over
// random sequences in both families, leave the tables Compile builds, and
// compare only the ports handed over. Every other seed keeps the applied
// piece of every port, as of a wide one.
func TestSyncChangesMatchesCompile(t *testing.T) {
	defer func(v, w int) { keptFromEndpoints, wideFrom = v, w }(keptFromEndpoints, wideFrom)
	for seed := range uint64(10) {
		keptFromEndpoints = []int{0, 64}[seed%2]
		wideFrom = []int{64, 2}[seed/2%2] // and every other pair crosses the wide maps' threshold
		g := newRandomSnapshots(seed)
		k := &modelKernel{t: t, tables: map[m.Family]*m.Ruleset{}}
		// The health check servers follow the changed ports as a full
		// update follows the snapshot.
		hc, ref := NewHealthChecks(zap.NewNop(), NewHealth(60e9), HealthCheckOptions{Listen: idleListen}),
			NewHealthChecks(zap.NewNop(), NewHealth(60e9), HealthCheckOptions{Listen: idleListen})
		defer hc.Close()
		defer ref.Close()
		p := New(Options{Configs: incrementalConfigs, Kernel: k, HealthChecks: hc})
		snap := g.next()
		if err := p.Sync(context.Background(), snap, true); err != nil {
			t.Fatal(err)
		}
		for step := range 40 {
			prev := snap
			snap = g.next()
			ch := changesBetween(prev, snap)
			if err := p.SyncChanges(context.Background(), ch); err != nil {
				t.Fatal(err)
			}
			ref.Update(snap)
			if got, want := serving(hc), serving(ref); !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: health check servers %v, want %v", seed, step, got, want)
			}
			if p.compared != len(ch.Ports) {
				t.Fatalf("seed %d step %d: compared %d ports, %d were handed over", seed, step, p.compared, len(ch.Ports))
			}
			for _, cfg := range incrementalConfigs {
				want := compileWithSlots(snap, cfg, p.applied[cfg.Family].slots)
				if diff := gocmp.Diff(normalRender(want), normalRender(k.tables[cfg.Family])); diff != "" {
					t.Fatalf("seed %d step %d %s: tables differ from Compile (-compiled +synced):\n%s", seed, step, cfg.Family, diff)
				}
			}
		}
	}
}

// TestSyncChangesComparesOnlyWhatChanged: with many services applied, a
// delta sync of one changed endpoint compares one service port, and a sync
// of nothing none.
func TestSyncChangesComparesOnlyWhatChanged(t *testing.T) {
	var k recordingKernel
	p := New(Options{Configs: []Config{testConfig}, Kernel: &k})
	snap := &k8s.Snapshot{}
	for i := range 1000 {
		snap.Services = append(snap.Services, svc(fmt.Sprintf("svc-%04d", i), "http",
			netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), 2))
	}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	changed := svc("svc-0042", "http", "10.96.0.42", 3)
	for _, tt := range []struct {
		name  string
		ports map[k8s.ServicePortName]*k8s.ServicePort
		want  []string
	}{
		{"one endpoint added", map[k8s.ServicePortName]*k8s.ServicePort{changed.Name: &changed}, []string{"delta ip"}},
		{"nothing", nil, nil},
	} {
		k.calls = nil
		if err := p.SyncChanges(context.Background(), k8s.Changes{Ports: tt.ports, Node: snap.Node}); err != nil {
			t.Fatal(err)
		}
		if p.compared != len(tt.ports) || !slices.Equal(k.calls, tt.want) {
			t.Errorf("%s: compared %d ports, kernel calls %v; want %d, %v", tt.name, p.compared, k.calls, len(tt.ports), tt.want)
		}
	}
}

// TestSyncFullWhenASetOutgrowsItsSize: a set declared with a size takes
// delta syncs while its elements fit, and one that would overflow it makes
// the sync full, which declares it again, larger.
func TestSyncFullWhenASetOutgrowsItsSize(t *testing.T) {
	defer func(v int) { sizedFrom = v }(sizedFrom)
	sizedFrom = 4
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig}, Kernel: k})
	sizes := func() (endpoints, hairpin uint32) {
		st := p.applied[testConfig.Family]
		return st.sizes[st.c.endpoints], st.sizes[st.c.hairpin]
	}
	for _, step := range []struct {
		endpoints          int
		want               string
		endpointsSize, hps uint32
	}{
		{3, "full ip", 0, 0},  // below sizedFrom: no size
		{4, "delta ip", 0, 0}, // an unsized set takes any number
		{9, "delta ip", 0, 0},
		{5, "full ip", 16, 16}, // (forced) sized from 2n
		{8, "delta ip", 16, 16},
		{16, "delta ip", 16, 16},
		{17, "full ip", 64, 64}, // outgrew 16: declared again
	} {
		k.calls = nil
		snap := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", step.endpoints)}}
		full := step.endpoints == 5
		if err := p.Sync(context.Background(), snap, full); err != nil {
			t.Fatal(err)
		}
		ep, hp := sizes()
		if !slices.Equal(k.calls, []string{step.want}) || ep != step.endpointsSize || hp != step.hps {
			t.Errorf("%d endpoints: kernel calls %v, sizes %d, %d; want %s, %d, %d", step.endpoints, k.calls, ep, hp, step.want, step.endpointsSize, step.hps)
		}
	}
}

// TestLeanFullSync: a full sync runs under a soft memory limit of
// FullSyncMemoryFactor times what the runtime holds, and the previous limit
// comes back after it, error or not; zero leaves the limit alone, and so
// does a lower limit already set (it is never raised).
func TestLeanFullSync(t *testing.T) {
	const none = math.MaxInt64
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	tests := []struct {
		name   string
		before int64 // the limit set before the sync
		factor float64
		lean   bool // the sync runs under factor times what the runtime holds
	}{
		{"no limit before", none, 1.4, true},
		{"option unset", none, 0, false},
		{"a lower limit before", 1 << 20, 1.4, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			debug.SetMemoryLimit(tt.before)
			p := New(Options{Configs: []Config{{Family: m.IPv4}}, FullSyncMemoryFactor: tt.factor})
			var during int64
			var held uint64
			err := p.leanFullSync(func() error {
				during, held = debug.SetMemoryLimit(-1), heldMemory()
				return errors.New("boom")
			})
			if err == nil || err.Error() != "boom" {
				t.Errorf("err %v, want the sync's", err)
			}
			switch {
			case !tt.lean && during != tt.before:
				t.Errorf("limit %d during the sync, want %d (left alone)", during, tt.before)
			case tt.lean:
				want := max(int64(float64(held)*tt.factor), int64(held)+leanHeadroom)
				if during < want*9/10 || during > want*11/10 {
					t.Errorf("limit %d MiB during the sync, want about %d MiB (%.1f times the %d MiB held, or %d MiB more)",
						during>>20, want>>20, tt.factor, held>>20, leanHeadroom>>20)
				}
			}
			if after := debug.SetMemoryLimit(-1); after != tt.before {
				t.Errorf("limit %d after the sync, want %d back", after, tt.before)
			}
		})
	}
}
