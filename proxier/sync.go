package proxier

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// Kernel writes rulesets; the netlink applier in the daemon's namespace is
// the real one.
type Kernel interface {
	Apply(rs *m.Ruleset) (m.Stats, error)
	ApplyChanges(f m.Family, table string, c *m.Changes) (m.Stats, error)
	// Generation is the namespace's nftables ruleset generation, which
	// every commit of any program increments.
	Generation() (uint32, error)
}

// NetlinkKernel is the real Kernel: the netlink applier on one connection,
// lasting in the daemon.
type NetlinkKernel struct{ Conn *m.Conn }

func (k NetlinkKernel) Apply(rs *m.Ruleset) (m.Stats, error) { return m.Apply(k.Conn, rs) }

func (k NetlinkKernel) ApplyChanges(f m.Family, table string, c *m.Changes) (m.Stats, error) {
	return m.ApplyChanges(k.Conn, f, table, c)
}

func (k NetlinkKernel) Generation() (uint32, error) { return m.Generation(k.Conn) }

// FlowCleaner deletes conntrack flows a sync made stale.
type FlowCleaner interface {
	Clean(ctx context.Context, prev, next *k8s.Snapshot) (deleted int, err error)
}

// Source is where snapshots come from: the tracker.
type Source interface {
	Snapshot() *k8s.Snapshot
	Changed() <-chan struct{}
}

// Options configure a Proxier. Configs holds one compile configuration per
// family the proxier programs.
type Options struct {
	Configs       []Config
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	Kernel        Kernel
	Flows         FlowCleaner   // optional
	HealthChecks  *HealthChecks // optional: healthCheckNodePort servers
	Logger        *zap.Logger
	Metrics       *Metrics
	Health        *Health
	// ReleaseMemory makes the proxier collect garbage and give freed memory
	// back to the OS after each full sync: a full sync (with the decoding
	// before the first) leaves garbage several times the live heap, which
	// would otherwise stay resident until the runtime's next collection.
	ReleaseMemory bool
	// OwnPort tells whether a netlink port ID is one of the sockets Kernel
	// commits on, so that Notify can tell our commits from others'.
	OwnPort func(port uint32) bool
	// Notifications, when set, is paused during each sync's batches (see
	// nftmodel.Watcher.Pause); a commit of another program meanwhile, told
	// by the generation, makes Run repair at once.
	Notifications Pauser
}

// Pauser is a subscription to notifications that can be paused.
type Pauser interface {
	Pause() error
	Resume() error
}

// Proxier keeps the kernel's tables equal to the compiled snapshot.
type Proxier struct {
	opts    Options
	applied map[m.Family]*incremental // nil entry: kernel state unknown, next sync is full
	prev    *k8s.Snapshot
	// gen is the ruleset generation the last sync left, when its own
	// commits were the only ones during the sync (genKnown).
	gen      uint32
	genKnown bool
	// flowsFailed: the last conntrack cleanup failed; the next sync retries.
	flowsFailed bool
	// drift: Notify saw another program change our tables.
	drift *driftSignal
}

// New returns a Proxier; the first sync it makes is full.
func New(opts Options) *Proxier {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.Health == nil {
		opts.Health = NewHealth(2 * max(opts.SyncPeriod, time.Second))
	}
	var families []string
	for _, c := range opts.Configs {
		families = append(families, map[m.Family]string{m.IPv4: "IPv4", m.IPv6: "IPv6"}[c.Family])
	}
	opts.Health.SetFamilies(families...)
	return &Proxier{opts: opts, applied: map[m.Family]*incremental{}, drift: newDriftSignal()}
}

// retryDelay is the least wait after a failed sync, so a kernel that keeps
// refusing a batch is not hammered.
const retryDelay = time.Second

// Run syncs at once (in full), then whenever the source changes, at most once
// per MinSyncPeriod, and in full every SyncPeriod to repair drift. It returns
// when ctx ends, leaving the rules in place.
func (p *Proxier) Run(ctx context.Context, src Source) {
	resync := time.NewTicker(max(p.opts.SyncPeriod, time.Second))
	defer resync.Stop()
	pending, full := true, true
	// queuedAt is when the oldest change not yet applied arrived; zero when
	// none waits, so a periodic resync is not counted as programming.
	var lastSync, queuedAt time.Time
	var failed bool
	p.opts.Health.Queued()
	queuedAt = time.Now()
	for {
		var due <-chan time.Time
		if pending {
			wait := p.opts.MinSyncPeriod
			if failed {
				wait = max(wait, retryDelay)
			}
			due = time.After(max(0, wait-time.Since(lastSync)))
		}
		select {
		case <-ctx.Done():
			return
		case <-src.Changed():
			if queuedAt.IsZero() {
				queuedAt = time.Now()
			}
			pending = true
			p.opts.Health.Queued()
			continue
		case <-resync.C:
			if !failed && p.unchanged() {
				continue
			}
			pending, full = true, true
			continue
		case <-p.drift.ready:
			// Lost notifications matter only if a commit not ours happened
			// since the last sync. The due timer keeps a tamper storm to one
			// repair per MinSyncPeriod.
			t := p.drift.take()
			if t == tamperNone || (t == tamperUnknown && !failed && p.sameGeneration()) {
				continue
			}
			if !pending || !full {
				p.opts.Metrics.DriftRepairs.Inc()
				p.opts.Logger.Info("Another program changed nftproxy's tables; full sync")
			}
			pending, full = true, true
			continue
		case <-due:
		}
		syncStart := time.Now()
		err := p.Sync(ctx, src.Snapshot(), full)
		lastSync = time.Now()
		failed = err != nil
		if failed {
			full = true
			continue
		}
		if full {
			p.drift.settledBy(syncStart)
		}
		if !queuedAt.IsZero() {
			p.opts.Metrics.NetworkProgramming.Observe(lastSync.Sub(queuedAt).Seconds())
			queuedAt = time.Time{}
		}
		if full && p.opts.ReleaseMemory {
			start := time.Now()
			debug.FreeOSMemory()
			p.opts.Logger.Debug("Released memory after a full sync", zap.Duration("took", time.Since(start)))
		}
		pending, full = false, false
	}
}

// unchanged tells whether no nftables commit happened in the namespace since
// the last sync, so the tables are as it left them: a periodic full sync,
// there to repair drift, would find none and is skipped (counted, and
// reported in the last-sync timestamp, as it verified the rules). Not while
// a conntrack cleanup waits for its retry.
func (p *Proxier) unchanged() bool {
	if p.flowsFailed || !p.sameGeneration() {
		return false
	}
	gen := p.gen
	p.opts.Metrics.ResyncsSkipped.Inc()
	p.opts.Metrics.SyncLastTimestamp.SetToCurrentTime()
	p.opts.Logger.Debug("Resync skipped: no nftables commit since the last sync", zap.Uint32("generation", gen))
	return true
}

// sameGeneration tells whether no nftables commit happened in the
// namespace since the last sync, which left the tables as it meant to.
func (p *Proxier) sameGeneration() bool {
	if !p.genKnown {
		return false
	}
	gen, err := p.opts.Kernel.Generation()
	return err == nil && gen == p.gen
}

// Sync compiles snap and brings every family's table to it: the whole table
// when full or when the kernel state is unknown, otherwise only the diff.
// On error the old ruleset stays in the kernel and the next sync is full.
func (p *Proxier) Sync(ctx context.Context, snap *k8s.Snapshot, full bool) error {
	start := time.Now()
	log := p.opts.Logger
	mt := p.opts.Metrics
	// Before anything can fail: a node being drained must fail /healthz
	// even when its rules can't be applied.
	p.opts.Health.SetNode(snap.Node)
	// The generation before and after tells whether the sync's commits
	// were the only ones; only then is the kernel known to hold our rules.
	// A commit of someone else since the last sync is repaired only by a
	// full sync of every family.
	wasKnown := p.genKnown
	p.genKnown = false
	before, genErr := p.opts.Kernel.Generation()
	wasKnown = wasKnown && genErr == nil && before == p.gen
	paused := p.opts.Notifications != nil && p.opts.Notifications.Pause() == nil
	resume := func() {
		if paused {
			if err := p.opts.Notifications.Resume(); err != nil {
				log.Error("Resuming nftables notifications failed; drift is repaired every --sync-period only", zap.Error(err))
			}
			paused = false
		}
	}
	defer resume()
	allFull := true
	var commits uint32
	diff, sorted := diffSnapshots(p.prev, snap)
	mt.ServiceChanges.Add(float64(diff.serviceChanges))
	mt.EndpointChanges.Add(float64(diff.endpointChanges))
	for _, cfg := range p.opts.Configs {
		// Only a sorted snapshot can be walked beside the last one.
		state, stats, kind, err := p.apply(snap, diff.ports, cfg, full || !sorted)
		if err != nil {
			// Every state must be at p.prev, which the next diff starts
			// from; the families synced before this one are at snap.
			clear(p.applied)
			mt.SyncFailures.Inc()
			log.Error("Sync failed; the previous ruleset stays in place and the next sync is full",
				zap.Stringer("family", cfg.Family), zap.String("kind", kind), zap.Error(err))
			return fmt.Errorf("sync %s table: %w", cfg.Family, err)
		}
		p.applied[cfg.Family] = state
		if kind != "none" {
			commits++
		}
		if kind == "full" {
			mt.FullSyncs.Inc()
		} else {
			allFull = false
		}
		if stats.Messages > 0 {
			mt.BatchMessages.Observe(float64(stats.Messages))
		}
		mt.RulesetElements.WithLabelValues(cfg.Family.String()).Set(float64(state.elements()))
		log.Debug("Synced ruleset", zap.Stringer("family", cfg.Family), zap.String("kind", kind),
			zap.Int("messages", stats.Messages), zap.Int("elements", stats.Elements), zap.Int("rules", stats.Rules))
		if ce := log.Check(zap.DebugLevel-1, "Applied ruleset"); ce != nil {
			ce.Write(zap.String("ruleset", m.Render(state.ruleset(snap))))
		}
	}
	wasPaused := paused
	resume()
	after, err := p.opts.Kernel.Generation()
	if genErr == nil && err == nil && after-before == commits && (wasKnown || allFull) {
		p.gen, p.genKnown = after, true
	}
	if wasPaused && (genErr != nil || err != nil || after-before != commits) {
		// Another program committed while nobody listened: maybe to our tables.
		p.drift.raise(tamperUnknown)
	}
	elapsed := time.Since(start)
	mt.SyncDuration.Observe(elapsed.Seconds())
	mt.SyncLastTimestamp.SetToCurrentTime()
	p.opts.Health.Updated()
	log.Info("Synced", zap.Bool("full", full), zap.Duration("took", elapsed),
		zap.Int("services", len(snap.Services)), zap.Int("serviceChanges", diff.serviceChanges), zap.Int("endpointChanges", diff.endpointChanges))
	if p.opts.HealthChecks != nil {
		p.opts.HealthChecks.Update(snap)
	}
	if p.opts.Flows != nil {
		p.cleanFlows(ctx, snap)
	}
	p.prev = snap
	return nil
}

// apply brings one family's table to snap: only the changes of the service
// ports that changed since the last sync (ports), or the whole compiled
// ruleset when full, when the kernel state is unknown, or when the change
// can't be made incrementally. It returns the state the kernel is in on
// success.
func (p *Proxier) apply(snap *k8s.Snapshot, ports []portChange, cfg Config, full bool) (*incremental, m.Stats, string, error) {
	// A full sync keeps the endpoints in their slots when it knows them:
	// whatever the kernel holds, it is then rewritten to match.
	var slots Slots
	if state := p.applied[cfg.Family]; state != nil {
		slots = state.slots
	}
	if state := p.applied[cfg.Family]; !full && state != nil {
		// update spoils the state when it fails; the kernel still has the
		// old ruleset then, and a full sync follows.
		p.applied[cfg.Family] = nil
		if changes, ok := state.update(snap, ports); ok {
			if changes.Empty() {
				return state, m.Stats{}, "none", nil
			}
			stats, err := p.opts.Kernel.ApplyChanges(cfg.Family, TableName, &changes)
			return state, stats, "delta", err
		}
	}
	state, desired := newIncremental(snap, cfg, slots)
	stats, err := p.opts.Kernel.Apply(desired)
	return state, stats, "full", err
}

func (p *Proxier) cleanFlows(ctx context.Context, snap *k8s.Snapshot) {
	start := time.Now()
	deleted, err := p.opts.Flows.Clean(ctx, p.prev, snap)
	p.opts.Metrics.ConntrackDuration.Observe(time.Since(start).Seconds())
	p.opts.Metrics.ConntrackDeleted.Add(float64(deleted))
	p.flowsFailed = err != nil
	if err != nil {
		p.opts.Metrics.ConntrackFailures.Inc()
		// Not fatal: the next sync tries again.
		p.opts.Logger.Warn("Cleaning stale conntrack entries failed", zap.Int("deleted", deleted), zap.Error(err))
	} else if deleted > 0 {
		p.opts.Logger.Info("Deleted stale conntrack entries", zap.Int("deleted", deleted))
	}
}

// portChange is a service port that differs between two snapshots: old is
// nil for an added one, new for a removed one.
type portChange struct{ old, new *k8s.ServicePort }

// snapshotDiff is what changed from one snapshot to the next.
type snapshotDiff struct {
	ports           []portChange
	serviceChanges  int // service ports whose service fields changed, added and removed included
	endpointChanges int // service ports whose endpoints changed
}

// diffSnapshots walks prev (nil: none) and next side by side; both are
// sorted by name, so this is one comparison per service port, the only
// pass over the whole snapshot a delta sync makes. It reports false when
// next is not sorted, which the walk relies on.
func diffSnapshots(prev, next *k8s.Snapshot) (snapshotDiff, bool) {
	var d snapshotDiff
	var old []k8s.ServicePort
	if prev != nil {
		old = prev.Services
	}
	cur := next.Services
	var last *k8s.ServicePort
	for len(old) > 0 || len(cur) > 0 {
		c := walkOrder(len(old), len(cur), func() int { return old[0].Name.Compare(cur[0].Name) })
		if c < 0 { // removed
			d.ports = append(d.ports, portChange{old: &old[0]})
			d.serviceChanges++
			old = old[1:]
			continue
		}
		n := &cur[0]
		cur = cur[1:]
		if last != nil && last.Name.Compare(n.Name) >= 0 {
			return d, false
		}
		last = n
		if c > 0 { // added
			d.ports = append(d.ports, portChange{new: n})
			d.serviceChanges++
			if len(n.Endpoints) > 0 {
				d.endpointChanges++
			}
			continue
		}
		o := &old[0]
		old = old[1:]
		fields, eps := sameServiceFields(o, n), sameEndpoints(o.Endpoints, n.Endpoints)
		if fields && eps {
			continue
		}
		d.ports = append(d.ports, portChange{old: o, new: n})
		if !fields {
			d.serviceChanges++
		}
		if !eps {
			d.endpointChanges++
		}
	}
	return d, true
}

// walkOrder tells which head a merge walk over two name-sorted lists, with
// oldLeft and curLeft items left, takes next: negative the old one (gone),
// positive the current one (new), zero both (same name; compare says).
func walkOrder(oldLeft, curLeft int, compare func() int) int {
	switch {
	case oldLeft == 0:
		return 1
	case curLeft == 0:
		return -1
	}
	return compare()
}
