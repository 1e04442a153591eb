package proxier

import (
	"context"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

func TestClassify(t *testing.T) {
	own := func(port uint32) bool { return port == 7 }
	ours := func(typ uint16, port uint32) m.Event {
		return m.Event{Type: typ, Family: unix.NFPROTO_IPV4, Table: TableName, Port: port}
	}
	v4 := []m.Family{m.IPv4}
	for _, tt := range []struct {
		name   string
		events []m.Event
		want   tamper
	}{
		{"nothing", nil, tamperNone},
		{"our own commit", []m.Event{ours(unix.NFT_MSG_NEWSETELEM, 7), ours(unix.NFT_MSG_DELCHAIN, 7), {Type: m.EventNewGen, Port: 7}}, tamperNone},
		{"another table", []m.Event{{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV4, Table: "filter", Port: 9}}, tamperNone},
		{"our table name in a family we don't program", []m.Event{{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV6, Table: TableName, Port: 9}}, tamperNone},
		{"inet table of our name", []m.Event{{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_INET, Table: TableName, Port: 9}}, tamperNone},
		{"another program's generation only", []m.Event{{Type: m.EventNewGen, Port: 9}}, tamperNone},
		{"flush ruleset", []m.Event{ours(unix.NFT_MSG_DELRULE, 9), ours(unix.NFT_MSG_DELSET, 9), ours(unix.NFT_MSG_DELTABLE, 9)}, tamperForeign},
		{"deleted element", []m.Event{ours(unix.NFT_MSG_DELSETELEM, 9)}, tamperForeign},
		{"added chain", []m.Event{ours(unix.NFT_MSG_NEWCHAIN, 9)}, tamperForeign},
		{"after our own", []m.Event{ours(unix.NFT_MSG_NEWSETELEM, 7), ours(unix.NFT_MSG_DELSETELEM, 9)}, tamperForeign},
		{"lost", []m.Event{{Lost: true}}, tamperUnknown},
		{"lost, then foreign", []m.Event{{Lost: true}, ours(unix.NFT_MSG_DELCHAIN, 9)}, tamperForeign},
	} {
		if got := classify(tt.events, v4, own); got != tt.want {
			t.Errorf("%s: classify = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestDriftSignalKeepsTheWorst(t *testing.T) {
	d := newDriftSignal()
	d.raise(tamperNone)
	select {
	case <-d.ready:
		t.Fatal("signalled nothing")
	default:
	}
	d.raise(tamperForeign)
	d.raise(tamperUnknown)
	<-d.ready
	if got := d.take(); got != tamperForeign {
		t.Errorf("take = %v, want foreign", got)
	}
	if got := d.take(); got != tamperNone {
		t.Errorf("second take = %v, want none", got)
	}
}

// TestSyncForgetsGenerationAfterForeignCommit: a commit of someone else
// between two syncs may have changed our table; a delta sync doesn't repair
// it, so the generation stays unknown (and a periodic resync runs) until a
// full sync.
func TestSyncForgetsGenerationAfterForeignCommit(t *testing.T) {
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig}, Kernel: k})
	one := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	two := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3)}}
	ctx := context.Background()
	if err := p.Sync(ctx, one, false); err != nil {
		t.Fatal(err)
	}
	k.gen++ // `nft flush ruleset`
	if err := p.Sync(ctx, two, false); err != nil {
		t.Fatal(err)
	}
	if p.sameGeneration() {
		t.Error("after a foreign commit and a delta: generation trusted")
	}
	if err := p.Sync(ctx, two, true); err != nil {
		t.Fatal(err)
	}
	if !p.sameGeneration() {
		t.Error("after a full sync: generation not trusted")
	}
}

// staticSource never changes.
type staticSource struct{ snap *k8s.Snapshot }

func (s staticSource) Snapshot() *k8s.Snapshot  { return s.snap }
func (s staticSource) Changed() <-chan struct{} { return nil }
func (s staticSource) TakeChanges() k8s.Changes { return k8s.Changes{Node: s.snap.Node} }

// lockedKernel is a recordingKernel safe to share with a running proxier.
type lockedKernel struct {
	mu sync.Mutex
	k  recordingKernel
}

func (l *lockedKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.k.Apply(rs)
}

func (l *lockedKernel) ApplyChanges(f m.Family, table string, c *m.Changes) (m.Stats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.k.ApplyChanges(f, table, c)
}

func (l *lockedKernel) Generation() (uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.k.Generation()
}

func (l *lockedKernel) fulls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.k.calls {
		if c == "full ip" {
			n++
		}
	}
	return n
}

func (l *lockedKernel) commitElsewhere() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.k.gen++
}

// TestRunRepairsTamperAtOnce: a foreign change to our table makes Run sync
// in full at once; a storm of them makes at most one sync per
// MinSyncPeriod; our own commits and lost notifications with no foreign
// commit make none.
func TestRunRepairsTamperAtOnce(t *testing.T) {
	k := &lockedKernel{}
	const minSync = 300 * time.Millisecond
	p := New(Options{Configs: []Config{testConfig}, Kernel: k, MinSyncPeriod: minSync, SyncPeriod: time.Hour,
		OwnPort: func(port uint32) bool { return port == 7 }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		p.Run(ctx, staticSource{&k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	waitFulls := func(n int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for k.fulls() < n {
			if time.Since(start) > within {
				t.Fatalf("%d full syncs after %v, want %d", k.fulls(), within, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitFulls(1, 5*time.Second)
	time.Sleep(minSync) // the next sync may start at once

	own := m.Event{Type: unix.NFT_MSG_NEWSETELEM, Family: unix.NFPROTO_IPV4, Table: TableName, Port: 7}
	p.Notify([]m.Event{own, {Lost: true}})
	time.Sleep(100 * time.Millisecond)
	if n := k.fulls(); n != 1 {
		t.Fatalf("our own commit and lost notifications without a foreign commit: %d full syncs, want 1", n)
	}

	foreign := m.Event{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV4, Table: TableName, Port: 9}
	k.commitElsewhere()
	p.Notify([]m.Event{foreign})
	t.Logf("repair started %v after the notification", waitFulls(2, time.Second))

	// A storm over 3 MinSyncPeriods: at most 4 more syncs.
	stormStart := time.Now()
	for time.Since(stormStart) < 3*minSync {
		k.commitElsewhere()
		p.Notify([]m.Event{foreign})
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(minSync + 50*time.Millisecond)
	if n := k.fulls() - 2; n < 1 || n > 4 {
		t.Errorf("a storm of %v made %d full syncs, want 1 to 4", 3*minSync, n)
	}
	if got := counterValue(t, p.opts.Metrics.DriftRepairs); got < 2 {
		t.Errorf("nftproxy_drift_repairs_total = %v, want ≥ 2", got)
	}
}

// countingPauser counts pauses and resumes.
type countingPauser struct{ paused, resumed int }

func (c *countingPauser) Pause() error  { c.paused++; return nil }
func (c *countingPauser) Resume() error { c.resumed++; return nil }

// TestSyncPausesNotifications: notifications are paused during a sync's
// batches; a commit of another program meanwhile, which nobody heard,
// raises the drift signal as a possible tamper.
func TestSyncPausesNotifications(t *testing.T) {
	k := &recordingKernel{}
	n := &countingPauser{}
	p := New(Options{Configs: []Config{testConfig}, Kernel: k, Notifications: n})
	snap := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	if n.paused != 1 || n.resumed != 1 {
		t.Errorf("paused %d, resumed %d times; want 1, 1", n.paused, n.resumed)
	}
	select {
	case <-p.drift.ready:
		t.Error("drift raised by our own commits")
	default:
	}
	p.opts.Kernel = &racingKernel{recordingKernel: k}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.drift.ready:
		if got := p.drift.take(); got != tamperUnknown {
			t.Errorf("drift = %v, want unknown", got)
		}
	default:
		t.Error("a foreign commit during a paused sync raised nothing")
	}
}

func TestDriftSettledByFullSync(t *testing.T) {
	d := newDriftSignal()
	d.raise(tamperForeign)
	start := time.Now()
	d.settledBy(start)
	if got := d.take(); got != tamperNone {
		t.Errorf("a tamper raised before a full sync started: %v left", got)
	}
	d.raise(tamperForeign)
	d.settledBy(start)
	if got := d.take(); got != tamperForeign {
		t.Errorf("a tamper raised during the sync: %v left, want foreign", got)
	}
}
