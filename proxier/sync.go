package proxier

import (
	"context"
	"fmt"
	"reflect"
	"slices"
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
}

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
}

// Proxier keeps the kernel's tables equal to the compiled snapshot.
type Proxier struct {
	opts    Options
	applied map[m.Family]*m.Ruleset // nil entry: kernel state unknown, next sync is full
	prev    *k8s.Snapshot
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
	return &Proxier{opts: opts, applied: map[m.Family]*m.Ruleset{}}
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
			if !pending {
				queuedAt = time.Now()
			}
			pending = true
			p.opts.Health.Queued()
			continue
		case <-resync.C:
			pending, full = true, true
			continue
		case <-due:
		}
		err := p.Sync(ctx, src.Snapshot(), full)
		lastSync = time.Now()
		failed = err != nil
		if failed {
			full = true
			continue
		}
		p.opts.Metrics.NetworkProgramming.Observe(lastSync.Sub(queuedAt).Seconds())
		pending, full = false, false
	}
}

// Sync compiles snap and brings every family's table to it: the whole table
// when full or when the kernel state is unknown, otherwise only the diff.
// On error the old ruleset stays in the kernel and the next sync is full.
func (p *Proxier) Sync(ctx context.Context, snap *k8s.Snapshot, full bool) error {
	start := time.Now()
	log := p.opts.Logger
	mt := p.opts.Metrics
	svcChanges, epChanges := countChanges(p.prev, snap)
	mt.ServiceChanges.Add(float64(svcChanges))
	mt.EndpointChanges.Add(float64(epChanges))
	for _, cfg := range p.opts.Configs {
		desired := Compile(snap, cfg)
		stats, kind, err := p.apply(desired, full)
		if err != nil {
			p.applied[cfg.Family] = nil
			mt.SyncFailures.Inc()
			log.Error("Sync failed; the previous ruleset stays in place and the next sync is full",
				zap.Stringer("family", cfg.Family), zap.String("kind", kind), zap.Error(err))
			return fmt.Errorf("sync %s table: %w", cfg.Family, err)
		}
		p.applied[cfg.Family] = desired
		if kind == "full" {
			mt.FullSyncs.Inc()
		}
		if stats.Messages > 0 {
			mt.BatchMessages.Observe(float64(stats.Messages))
		}
		mt.RulesetElements.WithLabelValues(cfg.Family.String()).Set(float64(elementCount(desired)))
		log.Debug("Synced ruleset", zap.Stringer("family", cfg.Family), zap.String("kind", kind),
			zap.Int("messages", stats.Messages), zap.Int("elements", stats.Elements), zap.Int("rules", stats.Rules))
		if ce := log.Check(zap.DebugLevel-1, "Applied ruleset"); ce != nil {
			ce.Write(zap.String("ruleset", m.Render(desired)))
		}
	}
	elapsed := time.Since(start)
	mt.SyncDuration.Observe(elapsed.Seconds())
	mt.SyncLastTimestamp.SetToCurrentTime()
	p.opts.Health.Updated()
	log.Info("Synced", zap.Bool("full", full), zap.Duration("took", elapsed),
		zap.Int("services", len(snap.Services)), zap.Int("serviceChanges", svcChanges), zap.Int("endpointChanges", epChanges))
	if p.opts.HealthChecks != nil {
		p.opts.HealthChecks.Update(snap)
	}
	if p.opts.Flows != nil {
		p.cleanFlows(ctx, snap)
	}
	p.prev = snap
	return nil
}

func (p *Proxier) apply(desired *m.Ruleset, full bool) (m.Stats, string, error) {
	applied := p.applied[desired.Family]
	if !full && applied != nil {
		changes, ok := m.Diff(applied, desired)
		if ok {
			if changes.Empty() {
				return m.Stats{}, "none", nil
			}
			stats, err := p.opts.Kernel.ApplyChanges(desired.Family, desired.Table, &changes)
			return stats, "delta", err
		}
	}
	stats, err := p.opts.Kernel.Apply(desired)
	return stats, "full", err
}

func (p *Proxier) cleanFlows(ctx context.Context, snap *k8s.Snapshot) {
	start := time.Now()
	deleted, err := p.opts.Flows.Clean(ctx, p.prev, snap)
	p.opts.Metrics.ConntrackDuration.Observe(time.Since(start).Seconds())
	p.opts.Metrics.ConntrackDeleted.Add(float64(deleted))
	if err != nil {
		// Not fatal: the next sync tries again.
		p.opts.Logger.Warn("Cleaning stale conntrack entries failed", zap.Int("deleted", deleted), zap.Error(err))
	} else if deleted > 0 {
		p.opts.Logger.Info("Deleted stale conntrack entries", zap.Int("deleted", deleted))
	}
}

// countChanges counts service ports whose service fields changed (added and
// removed included) and those whose endpoints changed.
func countChanges(prev, next *k8s.Snapshot) (services, endpoints int) {
	old := map[k8s.ServicePortName]*k8s.ServicePort{}
	if prev != nil {
		for i := range prev.Services {
			old[prev.Services[i].Name] = &prev.Services[i]
		}
	}
	for i := range next.Services {
		sp := &next.Services[i]
		o, ok := old[sp.Name]
		delete(old, sp.Name)
		if !ok {
			services++
			if len(sp.Endpoints) > 0 {
				endpoints++
			}
			continue
		}
		if !reflect.DeepEqual(withoutEndpoints(*o), withoutEndpoints(*sp)) {
			services++
		}
		if !slices.EqualFunc(o.Endpoints, sp.Endpoints, func(a, b k8s.Endpoint) bool { return reflect.DeepEqual(a, b) }) {
			endpoints++
		}
	}
	return services + len(old), endpoints
}

func withoutEndpoints(sp k8s.ServicePort) k8s.ServicePort {
	sp.Endpoints = nil
	return sp
}

func elementCount(rs *m.Ruleset) int {
	n := 0
	for _, s := range rs.Sets {
		n += len(s.Elements)
	}
	return n
}
