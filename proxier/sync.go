package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// Kernel writes rulesets; the netlink applier in the daemon's namespace
// (nftnl.Kernel) is the real one.
type Kernel interface {
	// Apply replaces the table with rs, whose large sets may make their
	// elements from a Source (m.Materialized gives them all).
	Apply(rs *m.Ruleset) (m.Stats, error)
	ApplyChanges(f m.Family, table string, c *m.Changes) (m.Stats, error)
	// Generation is the namespace's nftables ruleset generation, which
	// every commit of any program increments.
	Generation() (uint32, error)
}

// AffinityPruner is a Kernel that can delete elements of a map the packet
// path fills (session affinity's), and returns how many it deleted.
type AffinityPruner interface {
	PruneElements(f m.Family, table string, set *m.Set, keep func(m.Element) bool) (int, error)
}

// CounterReader is a Kernel that reads the packets its rules' counters
// counted (nftnl.Kernel): the invalid drops are reported from it.
type CounterReader interface {
	CounterPackets(f m.Family, table, chain string) (uint64, error)
}

// FlowCleaner deletes conntrack flows a sync made stale.
type FlowCleaner interface {
	Clean(ctx context.Context, prev, next *k8s.Snapshot) (FlowsDeleted, error)
}

// FlowsDeleted counts the flows a cleanup deleted, by family.
type FlowsDeleted struct{ IPv4, IPv6 int }

// Source is where snapshots come from: the tracker.
type Source interface {
	Snapshot() *k8s.Snapshot
	// TakeChanges hands over the service ports that changed since the
	// last call: a delta sync looks at nothing else.
	TakeChanges() k8s.Changes
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
	// FullSyncMemoryFactor, when positive, puts a full sync under a soft
	// memory limit (debug.SetMemoryLimit) of this many times the memory
	// the runtime holds as it starts (at least leanHeadroom more), the
	// previous limit restored after (and never raised). A full sync
	// allocates about what the daemon keeps, most of it live until the
	// batch is sent: at Go's default the heap grew to twice the state
	// before the sync's first collection, the start-up's peak. Under the
	// limit the collector runs only as the heap nears it; a sync that stays
	// below costs nothing more.
	FullSyncMemoryFactor float64
	// OwnPort tells whether a netlink port ID is one of the sockets Kernel
	// commits on, so that Notify can tell our commits from others'.
	OwnPort func(port uint32) bool
	// Notifications, when set, is paused during each sync's batches (see
	// nftnl.Watcher.Pause); a commit of another program meanwhile, told
	// by the generation, makes Run repair at once.
	Notifications Pauser
	// AfterSync, when set, runs after each successful sync until it
	// returns nil: what may only happen once the rules are in the kernel
	// (route_localnet, after the localnet guard). Its errors are logged.
	AfterSync func() error
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
	// ports are the service ports of the last successful sync, by name
	// (nil before the first): the versions a change replaces.
	ports map[k8s.ServicePortName]*k8s.ServicePort
	node  k8s.Node // of the last successful sync
	// compared counts the service ports the last sync compared with their
	// previous version: a test checks a delta sync compares only the ones
	// handed over.
	compared int
	// gen is the ruleset generation the last sync left, when its own
	// commits were the only ones during the sync (genKnown).
	gen      uint32
	genKnown bool
	// flowsFailed: the last conntrack cleanup failed; the next sync retries.
	flowsFailed bool
	// drift: Notify saw another program change our tables.
	drift *driftSignal
	// noLocal counts, by family, the service ports whose Local traffic
	// policy finds no local endpoint, as of the last successful sync.
	noLocal map[m.Family]*noLocalCounts
	// invalid counts the packets dropped as conntrack-invalid; nil when the
	// kernel can't read counters.
	invalid *invalidDrops
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
	var fams []m.Family
	noLocal := map[m.Family]*noLocalCounts{}
	for _, c := range opts.Configs {
		families = append(families, familyLabel(c.Family))
		fams = append(fams, c.Family)
		noLocal[c.Family] = &noLocalCounts{}
	}
	opts.Health.SetFamilies(families...)
	opts.Metrics.initFamilies(fams)
	p := &Proxier{opts: opts, applied: map[m.Family]*incremental{}, drift: newDriftSignal(), noLocal: noLocal}
	if cr, ok := opts.Kernel.(CounterReader); ok {
		p.invalid = newInvalidDrops(cr, opts.Configs, opts.Logger)
		// Another proxier on the same metrics registered one already.
		_ = opts.Metrics.Registry.Register(p.invalid)
	}
	return p
}

// pendingCounter is a source that counts the changes no sync has taken yet.
type pendingCounter interface {
	Pending() (services, endpoints uint64)
}

// queued records that a sync is wanted, for /healthz and kube-proxy's
// last-queued timestamp.
func (p *Proxier) queued() {
	p.opts.Health.Queued()
	for _, c := range p.opts.Configs {
		p.opts.Metrics.SyncLastQueued.WithLabelValues(familyLabel(c.Family)).SetToCurrentTime()
	}
}

// observeProgramming records kube-proxy's network programming latency of
// the endpoint changes a successful sync applied, in their family.
func (p *Proxier) observeProgramming(triggers []k8s.TriggerTime, done time.Time) {
	for _, tt := range triggers {
		f := m.IPv4
		if tt.IPv6 {
			f = m.IPv6
		}
		if !slices.ContainsFunc(p.opts.Configs, func(c Config) bool { return c.Family == f }) {
			continue
		}
		p.opts.Metrics.NetworkProgramming.WithLabelValues(familyLabel(f)).Observe(done.Sub(tt.Time).Seconds())
	}
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
	if pc, ok := src.(pendingCounter); ok {
		p.opts.Metrics.watchPending(pc.Pending)
	}
	p.queued()
	l := runLoop{pending: true, full: true, queuedAt: time.Now()}
	for {
		due := l.due(p.opts.MinSyncPeriod)
		select {
		case <-ctx.Done():
			return
		case <-src.Changed():
			if l.queuedAt.IsZero() {
				l.queuedAt = time.Now()
			}
			l.pending = true
			p.queued()
			continue
		case <-resync.C:
			if !l.failed && p.unchanged() {
				continue
			}
			l.pending, l.full = true, true
			continue
		case <-p.drift.ready:
			p.onDrift(&l)
			continue
		case <-due:
		}
		p.syncOnce(ctx, src, &l)
	}
}

// runLoop is what Run keeps between syncs.
type runLoop struct {
	pending, full bool
	failed        bool // the last sync failed: the next is full, after retryDelay
	lastSync      time.Time
	// queuedAt is when the oldest change not yet applied arrived; zero when
	// none waits, so a periodic resync is not counted as programming.
	queuedAt time.Time
	// triggers are the trigger times of the changes taken and not yet
	// applied: a failed sync's are applied by the retry.
	triggers []k8s.TriggerTime
}

// due fires when a pending sync may run: MinSyncPeriod after the last one,
// at least retryDelay after a failure; nil when no sync is pending.
func (l *runLoop) due(minSyncPeriod time.Duration) <-chan time.Time {
	if !l.pending {
		return nil
	}
	wait := minSyncPeriod
	if l.failed {
		wait = max(wait, retryDelay)
	}
	return time.After(max(0, wait-time.Since(l.lastSync)))
}

// onDrift asks for a full sync when another program may have changed
// nftproxy's tables.
func (p *Proxier) onDrift(l *runLoop) {
	// Lost notifications matter only if a commit not ours happened
	// since the last sync. The due timer keeps a tamper storm to one
	// repair per MinSyncPeriod.
	t := p.drift.take()
	if t == tamperNone || (t == tamperUnknown && !l.failed && p.sameGeneration()) {
		return
	}
	if !l.pending || !l.full {
		p.opts.Metrics.DriftRepairs.Inc()
		p.opts.Logger.Info("Another program changed nftproxy's tables; full sync")
	}
	l.pending, l.full = true, true
	p.queued()
}

// syncOnce applies the source's changes, in full when l asks: a failed sync
// stays pending, and its retry is full.
func (p *Proxier) syncOnce(ctx context.Context, src Source, l *runLoop) {
	syncStart := time.Now()
	var err error
	// Taken first: the snapshot holds at least what was handed over.
	ch := src.TakeChanges()
	l.triggers = append(l.triggers, ch.TriggerTimes...)
	if l.full {
		err = p.leanFullSync(func() error { return p.Sync(ctx, src.Snapshot(), true) })
	} else {
		err = p.SyncChanges(ctx, ch)
	}
	l.lastSync = time.Now()
	l.failed = err != nil
	if l.failed {
		l.full = true
		return
	}
	p.afterSync(l, syncStart)
	l.pending, l.full = false, false
}

// afterSync records a successful sync that started at syncStart and does
// what waited for it.
func (p *Proxier) afterSync(l *runLoop, syncStart time.Time) {
	if l.full {
		p.drift.settledBy(syncStart)
	}
	p.observeProgramming(l.triggers, l.lastSync)
	l.triggers = nil
	if !l.queuedAt.IsZero() {
		p.opts.Metrics.ChangeToKernel.Observe(l.lastSync.Sub(l.queuedAt).Seconds())
		l.queuedAt = time.Time{}
	}
	if l.full && p.opts.ReleaseMemory {
		start := time.Now()
		debug.FreeOSMemory()
		p.opts.Logger.Debug("Released memory after a full sync", zap.Duration("took", time.Since(start)))
	}
	if p.opts.AfterSync != nil {
		if err := p.opts.AfterSync(); err != nil {
			p.opts.Logger.Error("After the sync", zap.Error(err))
		} else {
			p.opts.AfterSync = nil
		}
	}
}

// leanHeadroom is the least a full sync's soft memory limit leaves above
// what the runtime holds: a small state's peak is small anyway, and a limit
// a few MiB over a small heap would have the collector run through the
// whole sync.
const leanHeadroom = 32 << 20

// leanFullSync runs a full sync under a soft memory limit of
// FullSyncMemoryFactor times the memory the runtime holds as it starts, or
// leanHeadroom more, whichever is higher.
func (p *Proxier) leanFullSync(sync func() error) error {
	if f := p.opts.FullSyncMemoryFactor; f > 0 {
		held := heldMemory()
		limit := max(int64(f*float64(held)), int64(held)+leanHeadroom)
		if prev := debug.SetMemoryLimit(-1); limit < prev {
			debug.SetMemoryLimit(limit)
			defer debug.SetMemoryLimit(prev)
		}
	}
	return sync()
}

// heldMemory is the memory the Go runtime holds from the OS: what its soft
// memory limit counts.
func heldMemory() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
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
	for _, c := range p.opts.Configs {
		p.opts.Metrics.SyncLastTimestamp.WithLabelValues(familyLabel(c.Family)).SetToCurrentTime()
	}
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
// Finding what changed walks snap beside the last sync's ports; the daemon's
// delta syncs go through SyncChanges instead.
func (p *Proxier) Sync(ctx context.Context, snap *k8s.Snapshot, full bool) error {
	p.compared = len(snap.Services)
	return p.sync(ctx, syncInput{ports: diffPorts(p.ports, snap), node: snap.Node,
		serviceCIDRs: snap.ServiceCIDRs, snap: snap, full: full})
}

// SyncChanges brings every family's table along the changes the source
// handed over, at a cost that grows with what changed, not with the number
// of services. A change that can't be made incrementally (the node, the
// service CIDRs) makes it full, from the last sync's ports with the changes.
func (p *Proxier) SyncChanges(ctx context.Context, ch k8s.Changes) error {
	in := syncInput{node: ch.Node, serviceCIDRs: ch.ServiceCIDRs}
	p.compared = len(ch.Ports)
	for name, sp := range ch.Ports {
		old := p.ports[name]
		// A delta from the list applied to the new one is a change that
		// needs no comparing, and what patches a wide port (patch.go).
		var d *k8s.EndpointDelta
		if dl := ch.Deltas[name]; old != nil && sp != nil && dl != nil && dl.Leads(old.Endpoints, sp.Endpoints) {
			d = dl
		}
		switch {
		case old == nil && sp == nil:
		case d != nil || old == nil || sp == nil || !sameServicePort(old, sp):
			in.ports = append(in.ports, portChange{old: old, new: sp, delta: d})
		}
	}
	// In name order, as a walk of two snapshots would find them: the
	// changes, and so the batches, are deterministic.
	slices.SortFunc(in.ports, func(a, b portChange) int { return a.name().Compare(b.name()) })
	return p.sync(ctx, in)
}

// syncInput is what one sync brings the tables to.
type syncInput struct {
	ports        []portChange // the service ports that differ from p.ports
	node         k8s.Node
	serviceCIDRs []netip.Prefix
	snap         *k8s.Snapshot // the whole state; nil: made from p.ports and ports when needed
	full         bool
}

// snapshot returns the whole state, making it when none was given: only a
// full sync, a retried conntrack cleanup or a health-check change needs it.
func (in *syncInput) snapshot(prev map[k8s.ServicePortName]*k8s.ServicePort) *k8s.Snapshot {
	if in.snap == nil {
		in.snap = &k8s.Snapshot{Node: in.node, ServiceCIDRs: in.serviceCIDRs,
			Services: make([]k8s.ServicePort, 0, len(prev)+len(in.ports))}
		changed := make(map[k8s.ServicePortName]bool, len(in.ports))
		for _, pc := range in.ports {
			changed[pc.name()] = true
			if pc.new != nil {
				in.snap.Services = append(in.snap.Services, *pc.new)
			}
		}
		for name, sp := range prev {
			if !changed[name] {
				in.snap.Services = append(in.snap.Services, *sp)
			}
		}
		slices.SortFunc(in.snap.Services, func(a, b k8s.ServicePort) int { return a.Name.Compare(b.Name) })
	}
	return in.snap
}

func (p *Proxier) sync(ctx context.Context, in syncInput) error {
	start := time.Now()
	log := p.opts.Logger
	mt := p.opts.Metrics
	// Before anything can fail: a node being drained must fail /healthz
	// even when its rules can't be applied.
	p.opts.Health.SetNode(in.node)
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
	serviceChanges, endpointChanges := countChanges(in.ports)
	mt.ServiceChanges.Add(float64(serviceChanges))
	mt.EndpointChanges.Add(float64(endpointChanges))
	fs, err := p.applyFamilies(&in)
	if err != nil {
		return err
	}
	wasPaused := paused
	resume()
	after, err := p.opts.Kernel.Generation()
	if genErr == nil && err == nil && after-before == fs.commits && (wasKnown || fs.allFull) {
		p.gen, p.genKnown = after, true
	}
	if wasPaused && (genErr != nil || err != nil || after-before != fs.commits) {
		// Another program committed while nobody listened: maybe to our tables.
		p.drift.raise(tamperUnknown)
	}
	elapsed := time.Since(start)
	p.countNoLocal(&in)
	p.recordSync(elapsed, fs)
	p.opts.Health.Updated()
	log.Info("Synced", zap.Bool("full", in.full), zap.Duration("took", elapsed),
		zap.Int("serviceChanges", serviceChanges), zap.Int("endpointChanges", endpointChanges))
	// The servers listen on the node's addresses: a node change may move them.
	switch hc := p.opts.HealthChecks; {
	case hc == nil:
	case in.full || p.ports == nil || !reflect.DeepEqual(p.node, in.node):
		hc.Update(in.snapshot(p.ports))
	case healthChecksChanged(in.ports):
		// The ports that changed, not a snapshot of every service.
		hc.Change(in.ports)
	}
	if p.opts.Flows != nil {
		p.cleanFlows(ctx, &in)
	}
	if in.snap != nil {
		p.ports = portsOf(in.snap)
	} else {
		p.ports = withChanges(p.ports, in.ports)
	}
	p.node = in.node
	return nil
}

// familiesSynced is what applyFamilies did: each family's kind of sync and
// own time, and the commits it made.
type familiesSynced struct {
	kinds   []string
	own     []time.Duration
	commits uint32
	allFull bool
}

// applyFamilies brings each family's table to in; on a failure the tables
// are unknown and the next sync is full.
func (p *Proxier) applyFamilies(in *syncInput) (familiesSynced, error) {
	log, mt := p.opts.Logger, p.opts.Metrics
	fs := familiesSynced{kinds: make([]string, len(p.opts.Configs)), own: make([]time.Duration, len(p.opts.Configs)), allFull: true}
	for i, cfg := range p.opts.Configs {
		familyStart := time.Now()
		state, stats, kind, err := p.apply(in, cfg)
		fs.kinds[i] = kind
		switch {
		case err == nil && kind == "full" && stats.Kept == 0:
			// A new or recreated table holds no affinity entry yet.
			state.takePrune()
		case err == nil:
			var pruned int
			pruned, err = p.pruneAffinity(state, cfg)
			if pruned > 0 {
				fs.commits++
			}
		}
		fs.own[i] = time.Since(familyStart)
		if err != nil {
			// Every state must be at p.ports, which the next sync starts
			// from; the families synced before this one are past it.
			clear(p.applied)
			mt.SyncFailures.Inc()
			mt.NFTablesFailures.WithLabelValues(familyLabel(cfg.Family)).Inc()
			log.Error("Sync failed; the previous ruleset stays in place and the next sync is full",
				zap.Stringer("family", cfg.Family), zap.String("kind", kind), zap.Error(err))
			return fs, fmt.Errorf("sync %s table: %w", cfg.Family, err)
		}
		p.applied[cfg.Family] = state
		if kind != "none" {
			fs.commits++
		}
		if kind == "full" {
			mt.FullSyncs.Inc()
		} else {
			fs.allFull = false
		}
		if stats.Messages > 0 {
			mt.BatchMessages.Observe(float64(stats.Messages))
		}
		mt.RulesetElements.WithLabelValues(cfg.Family.String()).Set(float64(state.elements()))
		log.Debug("Synced ruleset", zap.Stringer("family", cfg.Family), zap.String("kind", kind),
			zap.Int("messages", stats.Messages), zap.Int("elements", stats.Elements), zap.Int("rules", stats.Rules))
		if ce := log.Check(zap.DebugLevel-1, "Applied ruleset"); ce != nil {
			ce.Write(zap.String("ruleset", m.Render(state.ruleset(in.snapshot(p.ports)))))
		}
	}
	return fs, nil
}

// recordSync observes a successful sync in the metrics.
func (p *Proxier) recordSync(elapsed time.Duration, fs familiesSynced) {
	mt := p.opts.Metrics
	mt.SyncTotal.Observe(elapsed.Seconds())
	for i, cfg := range p.opts.Configs {
		family := familyLabel(cfg.Family)
		took := familyDuration(elapsed, fs.own, i).Seconds()
		mt.SyncDuration.WithLabelValues(family).Observe(took)
		if fs.kinds[i] == "full" {
			mt.SyncFullDuration.WithLabelValues(family).Observe(took)
		} else {
			mt.SyncPartialDuration.WithLabelValues(family).Observe(took)
		}
		mt.SyncLastTimestamp.WithLabelValues(family).SetToCurrentTime()
		nl := p.noLocal[cfg.Family]
		mt.NoLocalEndpoints.WithLabelValues("internal", family).Set(float64(nl.internal))
		mt.NoLocalEndpoints.WithLabelValues("external", family).Set(float64(nl.external))
	}
}

// countNoLocal brings the no-local-endpoints counts to the sync's state:
// along the changed ports, as the counts follow the last sync's ports; from
// the whole state on a full sync, the first one, or when the node's name,
// which tells the local endpoints, changed.
func (p *Proxier) countNoLocal(in *syncInput) {
	rebuild := in.full || p.ports == nil || p.node.Name != in.node.Name
	for _, cfg := range p.opts.Configs {
		c := p.noLocal[cfg.Family]
		if rebuild {
			snap := in.snapshot(p.ports)
			*c = noLocalCounts{}
			for i := range snap.Services {
				sp := &snap.Services[i]
				c.set(sp.Name, noLocalOf(sp, &in.node, cfg))
			}
			continue
		}
		for _, pc := range in.ports {
			var v noLocal
			if pc.new != nil {
				var ok bool
				if v, ok = patchedNoLocal(p.applied[cfg.Family], pc.new, cfg); !ok {
					v = noLocalOf(pc.new, &in.node, cfg)
				}
			}
			c.set(pc.name(), v)
		}
	}
}

// apply brings one family's table to the sync's state: only the changes of
// the service ports that changed since the last sync, or the whole compiled
// ruleset when full, when the kernel state is unknown, or when the change
// can't be made incrementally. It returns the state the kernel is in on
// success.
func (p *Proxier) apply(in *syncInput, cfg Config) (*incremental, m.Stats, string, error) {
	// A full sync keeps the endpoints in their slots when it knows them:
	// whatever the kernel holds, it is then rewritten to match.
	var slots Slots
	if state := p.applied[cfg.Family]; state != nil {
		slots = state.slots
	}
	if state := p.applied[cfg.Family]; !in.full && state != nil {
		// update spoils the state when it fails; the kernel still has the
		// old ruleset then, and a full sync follows.
		p.applied[cfg.Family] = nil
		if changes, ok := state.update(in.node, in.serviceCIDRs, in.ports); ok {
			if changes.Empty() {
				return state, m.Stats{}, "none", nil
			}
			stats, err := p.opts.Kernel.ApplyChanges(cfg.Family, TableName, &changes)
			return state, stats, "delta", err
		}
	}
	state, desired := newIncremental(in.snapshot(p.ports), cfg, slots)
	// The full apply writes the counting rule anew, from zero.
	counted := p.invalid.beforeRewrite(cfg)
	stats, err := p.opts.Kernel.Apply(desired)
	if err == nil {
		p.invalid.rewritten(cfg.Family, counted)
	}
	return state, stats, "full", err
}

// familyDuration is what family i's rules took of a sync that lasted
// elapsed, in which own[j] went to family j's table alone: its own share and
// what the sync did for all families (reading the generation, pausing the
// notifications). kube-proxy runs one proxier per family, each timing its
// own rules; so a family's series doesn't count the other family's table.
func familyDuration(elapsed time.Duration, own []time.Duration, i int) time.Duration {
	shared := elapsed
	for _, d := range own {
		shared -= d
	}
	return max(shared, 0) + own[i]
}

// pruneAffinity deletes the affinity map's elements that name endpoints the
// sync removed (all that name no live endpoint, after a full sync), so no
// client is sent to them; it returns how many it deleted.
func (p *Proxier) pruneAffinity(state *incremental, cfg Config) (int, error) {
	pr := state.takePrune()
	pruner, ok := p.opts.Kernel.(AffinityPruner)
	if pr == nil || !ok {
		return 0, nil
	}
	n, err := pruner.PruneElements(cfg.Family, TableName, state.c.affinity, pr.keep)
	if n > 0 {
		p.opts.Logger.Debug("Deleted stale affinity entries", zap.Stringer("family", cfg.Family), zap.Int("deleted", n))
	}
	return n, err
}

// cleanFlows hands the conntrack cleaner the changed service ports only,
// as two partial snapshots: flows to the others can't have gone stale. The
// first sync (no previous state) and a retry after a failed cleanup give it
// the whole state as next.
func (p *Proxier) cleanFlows(ctx context.Context, in *syncInput) {
	start := time.Now()
	var prev, next *k8s.Snapshot
	if p.ports != nil {
		prev, next = &k8s.Snapshot{Node: p.node}, &k8s.Snapshot{Node: in.node}
		for _, pc := range in.ports {
			if pc.old != nil {
				prev.Services = append(prev.Services, *pc.old)
			}
			if pc.new != nil {
				next.Services = append(next.Services, *pc.new)
			}
		}
	}
	if p.ports == nil || p.flowsFailed {
		// The retry joins the failed call's ports to prev; next must
		// then hold them too.
		next = in.snapshot(p.ports)
	}
	byFamily, err := p.opts.Flows.Clean(ctx, prev, next)
	deleted := byFamily.IPv4 + byFamily.IPv6
	// One cleanup covers both families and can't be split between them:
	// each family observes it whole.
	for _, c := range p.opts.Configs {
		family := familyLabel(c.Family)
		p.opts.Metrics.ConntrackDuration.WithLabelValues(family).Observe(time.Since(start).Seconds())
		n := byFamily.IPv4
		if c.Family == m.IPv6 {
			n = byFamily.IPv6
		}
		p.opts.Metrics.ConntrackDeleted.WithLabelValues(family).Add(float64(n))
	}
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
// nil for an added one, new for a removed one. delta, when set, takes old's
// endpoints to new's.
type portChange struct {
	old, new *k8s.ServicePort
	delta    *k8s.EndpointDelta
}

// name is the service port's name.
func (pc portChange) name() k8s.ServicePortName {
	if pc.new != nil {
		return pc.new.Name
	}
	return pc.old.Name
}

// countChanges counts the service ports whose service fields changed
// (added and removed ones included) and those whose endpoints changed.
func countChanges(ports []portChange) (services, endpoints int) {
	for _, pc := range ports {
		switch {
		case pc.old == nil:
			services++
			if len(pc.new.Endpoints) > 0 {
				endpoints++
			}
		case pc.new == nil:
			services++
		default:
			if !sameServiceFields(pc.old, pc.new) {
				services++
			}
			if pc.delta != nil || !sameEndpoints(pc.old.Endpoints, pc.new.Endpoints) {
				endpoints++
			}
		}
	}
	return services, endpoints
}

// healthChecksChanged tells whether a change concerns a health check node
// port, which the health-check servers must follow.
func healthChecksChanged(ports []portChange) bool {
	for _, pc := range ports {
		for _, sp := range []*k8s.ServicePort{pc.old, pc.new} {
			if sp != nil && sp.HealthCheckNodePort != 0 {
				return true
			}
		}
	}
	return false
}

// diffPorts finds the service ports of snap that differ from prev (nil:
// none), in snap's order, the removed ones after them: one map look-up per
// service port of snap.
func diffPorts(prev map[k8s.ServicePortName]*k8s.ServicePort, snap *k8s.Snapshot) []portChange {
	var out []portChange
	seen := 0
	for i := range snap.Services {
		n := &snap.Services[i]
		o := prev[n.Name]
		if o != nil {
			seen++
			if sameServicePort(o, n) {
				continue
			}
		}
		out = append(out, portChange{old: o, new: n})
	}
	if seen < len(prev) {
		in := make(map[k8s.ServicePortName]bool, len(snap.Services))
		for i := range snap.Services {
			in[snap.Services[i].Name] = true
		}
		var gone []portChange
		for name, o := range prev {
			if !in[name] {
				gone = append(gone, portChange{old: o})
			}
		}
		slices.SortFunc(gone, func(a, b portChange) int { return a.name().Compare(b.name()) })
		out = append(out, gone...)
	}
	return out
}

// portsOf indexes a snapshot's service ports by name.
func portsOf(snap *k8s.Snapshot) map[k8s.ServicePortName]*k8s.ServicePort {
	out := make(map[k8s.ServicePortName]*k8s.ServicePort, len(snap.Services))
	for i := range snap.Services {
		out[snap.Services[i].Name] = &snap.Services[i]
	}
	return out
}

// withChanges applies the changes to ports, in place (a new map when ports
// is nil), and returns it.
func withChanges(ports map[k8s.ServicePortName]*k8s.ServicePort, changes []portChange) map[k8s.ServicePortName]*k8s.ServicePort {
	if ports == nil {
		ports = map[k8s.ServicePortName]*k8s.ServicePort{}
	}
	for _, pc := range changes {
		if pc.new == nil {
			delete(ports, pc.old.Name)
		} else {
			ports[pc.new.Name] = pc.new
		}
	}
	return ports
}
