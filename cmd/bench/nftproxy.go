package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// childReport is what a child sync prints on standard output.
type childReport struct {
	CompileMS float64 `json:"compile_ms"`
	ApplyMS   float64 `json:"apply_ms"`
	Elements  int     `json:"elements"`
	// PeakKiB is the child's VmHWM. getrusage's maxrss of a child can't
	// serve: Linux counts into it the memory of the parent the child was
	// cloned from before exec, and the bench is bigger than a small sync.
	PeakKiB int `json:"peak_kib"`
	// Live heap after a collection at each stage, with --child-memstats.
	HeapMiB map[string]float64 `json:"heap_mib,omitempty"`
	// cpuMS is the child's user and system time, as the parent sees it.
	cpuMS float64
}

// Stages of the child's live-heap report.
const (
	stageSnapshot = "snapshot"
	stageCompiled = "snapshot + ruleset"
)

// childSync is the re-executed program: one full sync of n services into its
// own namespace, as a daemon's first sync does (proxier.Sync: compile,
// one netlink batch), and nothing else, so its rusage is the sync's. With
// memstats it collects garbage between stages to report the live heap,
// which slows it.
func childSync(n int, memstats bool) error {
	rep := childReport{HeapMiB: map[string]float64{}}
	heap := func(stage string) {
		if memstats {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			rep.HeapMiB[stage] = float64(ms.HeapAlloc) / (1 << 20)
		}
	}
	snap := snapshot(n, nil)
	heap(stageSnapshot)
	conn, err := nftnl.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	// The batch is sent once the ruleset is assembled: the heap then holds
	// the snapshot and the ruleset, and the rest of the sync is netlink.
	k := &timedKernel{Kernel: nftnl.Kernel{Conn: conn}, beforeFull: func() { heap(stageCompiled) }}
	p := proxier.New(proxier.Options{Configs: []proxier.Config{compileConfig}, Kernel: k})
	start := time.Now()
	if err := p.Sync(context.Background(), snap, true); err != nil {
		return err
	}
	total := time.Since(start)
	rep.CompileMS, rep.ApplyMS, rep.Elements = ms(total-k.took), ms(k.took), k.stats.Elements
	runtime.KeepAlive(snap)
	st, err := e2e.ProcStatus(os.Getpid())
	if err != nil {
		return err
	}
	rep.PeakKiB = st["VmHWM"]
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// runChild runs one full sync of n services in a child process and a fresh
// namespace; env is added to the child's environment.
func runChild(n int, memstats bool, env ...string) (rep childReport, err error) {
	self, err := os.Executable()
	if err != nil {
		return rep, fmt.Errorf("find own executable: %w", err)
	}
	err = freshNS(func(ns *netns.NS) error {
		run, err := runTool(ns, "", env, self, "--child-sync", strconv.Itoa(n), "--child-memstats="+strconv.FormatBool(memstats))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(run.out, &rep); err != nil {
			return fmt.Errorf("read child report: %w", err)
		}
		rep.cpuMS = ms(run.cpu)
		return nil
	})
	return rep, err
}

// memLimit is the soft memory limit of the alternative full sync: the
// target's RSS bound less the 20 MiB the binary maps that Go does not count
// (the RSS of a sync of one service).
const memLimit = "130MiB"

// fullSyncNftproxy times full syncs of n services in child processes, each
// in a fresh namespace, and records their peak RSS and CPU; then the same
// with a soft memory limit at the target, once with a limit so low that the
// collector runs all the time (its peak RSS is the live peak plus the
// runtime's own), and once reporting the live heap between stages.
func fullSyncNftproxy(res *Results, n, runs int) error {
	for _, alt := range []struct {
		method string
		env    []string
		runs   int
	}{{methodNftproxy, nil, runs}, {methodMemLimit, []string{"GOMEMLIMIT=" + memLimit}, runs}, {methodMemFloor, []string{"GOMEMLIMIT=1MiB"}, 1}} {
		var took, compile, apply, rss, cpu []float64
		for range alt.runs {
			r, err := runChild(n, false, alt.env...)
			if err != nil {
				return err
			}
			took, compile, apply = append(took, r.CompileMS+r.ApplyMS), append(compile, r.CompileMS), append(apply, r.ApplyMS)
			rss, cpu = append(rss, float64(r.PeakKiB)/1024), append(cpu, r.cpuMS)
		}
		res.add(n, metricFullSync, alt.method, took...)
		if alt.env == nil {
			// The split of the sync is the default child's alone.
			res.add(n, metricFullSync, methodCompile, compile...)
			res.add(n, metricFullSync, methodApply, apply...)
		}
		res.add(n, metricFullSyncRSS, alt.method, rss...)
		res.add(n, metricFullSyncCPU, alt.method, cpu...)
	}
	r, err := runChild(n, true)
	if err != nil {
		return err
	}
	for _, stage := range []string{stageSnapshot, stageCompiled} {
		res.add(n, metricLiveHeap, stage, r.HeapMiB[stage])
	}
	res.add(n, metricLiveHeap, "elements", float64(r.Elements))
	return nil
}

// fullSyncNftText loads the rendered ruleset with `nft -f -` into fresh
// namespaces. Rendering is not timed: a knftables-based proxy builds its
// text too, and what it pays on top is the nft binary's parsing and
// evaluation.
func fullSyncNftText(res *Results, n, runs int) error {
	text := m.Render(proxier.Compile(snapshot(n, nil), compileConfig))
	return loadFresh(res, n, runs, methodNftText, text, "nft", "-f", "-")
}

// updater keeps one namespace holding the ruleset of snap, and the
// connection and proxier a daemon would keep.
type updater struct {
	changer
	ns      *netns.NS
	conn    *nftnl.Conn
	applied *m.Ruleset // Compile(snap), for the paths that diff rulesets
	proxier *proxier.Proxier
	kernel  *timedKernel
	// The user-space and netlink shares of each viaSync, in milliseconds.
	user, apply []float64
}

// timedKernel is the daemon's kernel, timing each batch and keeping the
// last one's stats; beforeFull, when set, runs as a full apply starts.
type timedKernel struct {
	nftnl.Kernel
	beforeFull func()
	took       time.Duration
	stats      m.Stats
	changes    int
}

func (k *timedKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	if k.beforeFull != nil {
		k.beforeFull()
	}
	start := time.Now()
	st, err := k.Kernel.Apply(rs)
	k.took, k.stats = time.Since(start), st
	return st, err
}

func (k *timedKernel) ApplyChanges(f m.Family, table string, c *m.Changes) (m.Stats, error) {
	start := time.Now()
	st, err := k.Kernel.ApplyChanges(f, table, c)
	k.took, k.stats, k.changes = time.Since(start), st, k.changes+1
	return st, err
}

// viaSync is the daemon's sync of a change: proxier.SyncChanges with the
// service port that changed, as the tracker hands it over, which recompiles
// that port and sends its changes in one batch. It keeps the user-space and
// the netlink share.
func (u *updater) viaSync(c change) (time.Duration, error) {
	sp := &c.snap.Services[c.service]
	ch := k8s.Changes{Ports: map[k8s.ServicePortName]*k8s.ServicePort{sp.Name: sp},
		Node: c.snap.Node, ServiceCIDRs: c.snap.ServiceCIDRs}
	before := u.kernel.changes
	start := time.Now()
	if err := u.proxier.SyncChanges(context.Background(), ch); err != nil {
		return 0, err
	}
	took := time.Since(start)
	if u.kernel.changes != before+1 {
		return 0, errors.New("sync: the change was not sent as one incremental batch")
	}
	u.snap, u.applied = c.snap, nil
	u.user, u.apply = append(u.user, ms(took-u.kernel.took)), append(u.apply, ms(u.kernel.took))
	return took, nil
}

// viaDiff is the alternative the incremental compiler replaced: compile the
// whole new snapshot, diff it against the whole applied ruleset, send the
// changes in one batch.
func (u *updater) viaDiff(c change) (time.Duration, error) {
	applied := u.compiled()
	start := time.Now()
	desired, changes, err := u.diff(applied, c)
	if err == nil {
		_, err = nftnl.ApplyChanges(u.conn, desired.Family, desired.Table, changes)
	}
	return time.Since(start), err
}

// viaText sends the diff as an nft script through `nft -f -`, as a
// knftables-based proxy does; building the script is not timed.
func (u *updater) viaText(c change) (time.Duration, error) {
	desired, changes, err := u.diff(u.compiled(), c)
	if err != nil {
		return 0, err
	}
	return timeTool(u.ns, changesScript(desired.Family, desired.Table, changes), "nft", "-f", "-")
}

// diff compiles c's snapshot and diffs it against applied; the updater then
// takes the change as applied (an error stops the run anyway).
func (u *updater) diff(applied *m.Ruleset, c change) (*m.Ruleset, *m.Changes, error) {
	desired := proxier.Compile(c.snap, compileConfig)
	changes, ok := m.Diff(applied, desired)
	if !ok {
		return nil, nil, errors.New("diff: change not expressible incrementally")
	}
	u.applied, u.snap = desired, c.snap
	return desired, &changes, nil
}

// compiled is the ruleset of snap, compiled when needed (not timed).
func (u *updater) compiled() *m.Ruleset {
	if u.applied == nil {
		u.applied = proxier.Compile(u.snap, compileConfig)
	}
	return u.applied
}

// nftproxyUpdates loads n services once, then times runs of each kind of
// update through each path. Every update starts from the state the previous
// one left, as in a daemon; after the paths that bypass the proxier, a full
// sync (not timed) brings it back in step with the kernel.
func nftproxyUpdates(res *Results, n, runs int) error {
	return freshNS(func(ns *netns.NS) error {
		conn, err := nftnl.Dial(ns.Fd())
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		k := &timedKernel{Kernel: nftnl.Kernel{Conn: conn}}
		u := &updater{changer: changer{snap: snapshot(n, nil)}, ns: ns, conn: conn, kernel: k,
			proxier: proxier.New(proxier.Options{Configs: []proxier.Config{compileConfig}, Kernel: k})}
		resync := func() error { return u.proxier.Sync(context.Background(), u.snap, true) }
		if err := resync(); err != nil {
			return err
		}
		for _, kd := range u.kinds(runs) {
			for _, path := range []struct {
				method string
				via    func(change) (time.Duration, error)
			}{{methodNftproxy, u.viaSync}, {methodFullDiff, u.viaDiff}, {methodNftText, u.viaText}} {
				took, err := repeat(runs, func(run int) (time.Duration, error) { return path.via(kd.next(run)) })
				if err != nil {
					return fmt.Errorf("%s: %w", kd.metric, err)
				}
				res.add(n, kd.metric, path.method, took...)
			}
			res.add(n, kd.metric, methodCompile, u.user...)
			res.add(n, kd.metric, methodApply, u.apply...)
			u.user, u.apply = nil, nil
			if err := resync(); err != nil {
				return err
			}
		}
		return nil
	})
}
