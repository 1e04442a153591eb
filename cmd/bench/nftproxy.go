package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// childReport is what a child sync prints on standard output.
type childReport struct {
	CompileMS float64 `json:"compile_ms"`
	ApplyMS   float64 `json:"apply_ms"`
	Elements  int     `json:"elements"`
	// Live heap after a collection at each stage, with --child-memstats.
	HeapMiB map[string]float64 `json:"heap_mib,omitempty"`
}

// Stages of the child's live-heap report.
const (
	stageSnapshot = "snapshot"
	stageCompiled = "snapshot + ruleset"
)

// childSync is the re-executed program: one full sync of n services into the
// namespace at nsPath, as a daemon's first sync does (compile, one netlink
// batch), and nothing else, so its rusage is the sync's. With memstats it
// collects garbage between stages to report the live heap, which slows it.
func childSync(n int, nsPath string, memstats bool) error {
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
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer unix.Close(fd)
	conn, err := m.Dial(fd)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseLasting() }()
	start := time.Now()
	rs := proxier.Compile(snap, compileConfig)
	compiled := time.Now()
	heap(stageCompiled)
	stats, err := m.Apply(conn, rs)
	if err != nil {
		return err
	}
	rep.CompileMS, rep.ApplyMS, rep.Elements = ms(compiled.Sub(start)), ms(time.Since(compiled)), stats.Elements
	runtime.KeepAlive(snap)
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// childRun is one child sync's report and resource use.
type childRun struct {
	rep    childReport
	rssMiB float64
	cpuMS  float64
}

// runChild runs one full sync of n services in a child process and a fresh
// namespace; env is added to the child's environment.
func runChild(n int, memstats bool, env ...string) (childRun, error) {
	self, err := os.Executable()
	if err != nil {
		return childRun{}, fmt.Errorf("find own executable: %w", err)
	}
	var run childRun
	err = freshNS(func(ns *netns.NS) error {
		cmd := exec.Command(self, "--child-sync", strconv.Itoa(n), "--child-netns", "/run/netns/"+ns.Name(),
			"--child-memstats="+strconv.FormatBool(memstats))
		cmd.Env = append(os.Environ(), env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("run child sync: %w: %s", err, firstLines(errOut.String(), 5))
		}
		if err := json.Unmarshal(out.Bytes(), &run.rep); err != nil {
			return fmt.Errorf("read child report: %w", err)
		}
		ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if !ok {
			return errors.New("read child rusage: not a syscall.Rusage")
		}
		run.rssMiB = float64(ru.Maxrss) / 1024 // KiB
		run.cpuMS = ms(time.Duration(ru.Utime.Nano() + ru.Stime.Nano()))
		return nil
	})
	return run, err
}

// memLimit is the soft memory limit of the alternative full sync: the
// target's RSS bound.
const memLimit = "150MiB"

// fullSyncNftproxy times full syncs of n services in child processes, each
// in a fresh namespace, and records their peak RSS and CPU; then the same
// with a soft memory limit at the target, once with a limit so low that the
// collector runs all the time (its peak RSS is the live peak plus the
// runtime's own), and once reporting the live heap between stages.
func fullSyncNftproxy(res *Results, n, runs int) error {
	var total, compile, apply, rss, cpu []float64
	for range runs {
		r, err := runChild(n, false)
		if err != nil {
			return err
		}
		total = append(total, r.rep.CompileMS+r.rep.ApplyMS)
		compile, apply = append(compile, r.rep.CompileMS), append(apply, r.rep.ApplyMS)
		rss, cpu = append(rss, r.rssMiB), append(cpu, r.cpuMS)
	}
	res.add(n, metricFullSync, methodNftproxy, total...)
	res.add(n, metricFullSync, methodCompile, compile...)
	res.add(n, metricFullSync, methodApply, apply...)
	res.add(n, metricFullSyncRSS, methodNftproxy, rss...)
	res.add(n, metricFullSyncCPU, methodNftproxy, cpu...)

	for _, alt := range []struct {
		method, limit string
		runs          int
	}{{methodMemLimit, memLimit, runs}, {methodMemFloor, "1MiB", 1}} {
		var took, rss, cpu []float64
		for range alt.runs {
			r, err := runChild(n, false, "GOMEMLIMIT="+alt.limit)
			if err != nil {
				return err
			}
			took, rss, cpu = append(took, r.rep.CompileMS+r.rep.ApplyMS), append(rss, r.rssMiB), append(cpu, r.cpuMS)
		}
		res.add(n, metricFullSync, alt.method, took...)
		res.add(n, metricFullSyncRSS, alt.method, rss...)
		res.add(n, metricFullSyncCPU, alt.method, cpu...)
	}

	r, err := runChild(n, true)
	if err != nil {
		return err
	}
	for _, stage := range []string{stageSnapshot, stageCompiled} {
		res.add(n, metricLiveHeap, stage, r.rep.HeapMiB[stage])
	}
	res.add(n, metricLiveHeap, "elements", float64(r.rep.Elements))
	return nil
}

// fullSyncNftText loads the rendered ruleset with `nft -f -` into fresh
// namespaces. Rendering is not timed: a knftables-based proxy builds its
// text too, and what it pays on top is the nft binary's parsing and
// evaluation.
func fullSyncNftText(res *Results, n, runs int) error {
	text := m.Render(proxier.Compile(snapshot(n, nil), compileConfig))
	var took []float64
	for range runs {
		err := freshNS(func(ns *netns.NS) error {
			d, err := timeTool(ns, text, "nft", "-f", "-")
			took = append(took, ms(d))
			return err
		})
		if err != nil {
			return err
		}
	}
	res.add(n, metricFullSync, methodNftText, took...)
	return nil
}

// updater keeps one namespace holding the ruleset of snap, and the
// connection and model a daemon would keep.
type updater struct {
	ns      *netns.NS
	conn    *nftables.Conn
	snap    *k8s.Snapshot
	applied *m.Ruleset
	next    int // the next fresh endpoint address
}

// change is one update: the snapshot after it and the service it touched.
type change struct {
	snap    *k8s.Snapshot
	service int
}

func (u *updater) endpointChange(run, runs int) change {
	i := (run + 1) * len(u.snap.Services) / (runs + 2) // spread over the table
	u.next++
	return change{withEndpointChanged(u.snap, i, endpointAddr(uint32(1<<21+u.next))), i}
}

func (u *updater) serviceAdded() change {
	i := len(u.snap.Services)
	return change{withServiceAdded(u.snap, i), i}
}

// viaDiff is nftproxy's incremental sync: compile the new snapshot, diff it
// against the applied ruleset, send the changes in one batch.
func (u *updater) viaDiff(c change) (compile, diff, apply time.Duration, err error) {
	start := time.Now()
	desired := proxier.Compile(c.snap, compileConfig)
	compiled := time.Now()
	changes, ok := m.Diff(u.applied, desired)
	diffed := time.Now()
	if !ok {
		return 0, 0, 0, errors.New("diff: change not expressible incrementally")
	}
	if _, err := m.ApplyChanges(u.conn, desired.Family, desired.Table, &changes); err != nil {
		return 0, 0, 0, err
	}
	u.applied, u.snap = desired, c.snap
	return compiled.Sub(start), diffed.Sub(compiled), time.Since(diffed), nil
}

// viaDelta is the alternative this benchmark measures against: only the
// changed service is compiled (with a neighbour of the same shape, so the
// shared chains compare equal) and the tiny rulesets are diffed — what an
// incremental compiler keeping per-service fragments would send. The
// result is checked against the full diff before it is applied.
func (u *updater) viaDelta(c change, neighbour int) (time.Duration, error) {
	full, ok := m.Diff(u.applied, proxier.Compile(c.snap, compileConfig))
	if !ok {
		return 0, errors.New("diff: change not expressible incrementally")
	}
	start := time.Now()
	pick := func(snap *k8s.Snapshot, idx ...int) *k8s.Snapshot {
		out := &k8s.Snapshot{Node: snap.Node}
		for _, i := range idx {
			if i < len(snap.Services) {
				out.Services = append(out.Services, snap.Services[i])
			}
		}
		return out
	}
	before := proxier.Compile(pick(u.snap, neighbour, c.service), compileConfig)
	after := proxier.Compile(pick(c.snap, neighbour, c.service), compileConfig)
	delta, ok := m.Diff(before, after)
	if !ok {
		return 0, errors.New("diff per-service delta: not expressible incrementally")
	}
	if a, b := changeSummary(&delta), changeSummary(&full); a != b {
		return 0, fmt.Errorf("per-service delta %s differs from the full diff %s", a, b)
	}
	if _, err := m.ApplyChanges(u.conn, m.IPv4, proxier.TableName, &delta); err != nil {
		return 0, err
	}
	took := time.Since(start)
	u.applied, u.snap = proxier.Compile(c.snap, compileConfig), c.snap
	return took, nil
}

// viaText sends the diff as an nft script through `nft -f -`, as a
// knftables-based proxy does; building the script is not timed.
func (u *updater) viaText(c change) (time.Duration, error) {
	desired := proxier.Compile(c.snap, compileConfig)
	changes, ok := m.Diff(u.applied, desired)
	if !ok {
		return 0, errors.New("diff: change not expressible incrementally")
	}
	took, err := timeTool(u.ns, changesScript(desired.Family, desired.Table, &changes), "nft", "-f", "-")
	if err != nil {
		return 0, err
	}
	u.applied, u.snap = desired, c.snap
	return took, nil
}

// changeSummary describes changes by what they touch, to compare two diffs.
func changeSummary(c *m.Changes) string {
	s := fmt.Sprintf("sets +%d -%d chains +%d ~%d -%d;", len(c.AddSets), len(c.DelSets), len(c.AddChains), len(c.RewriteChains), len(c.DelChains))
	for _, se := range c.DelElements {
		s += fmt.Sprintf(" %s -%d", se.Set, len(se.Elements))
	}
	for _, se := range c.AddElements {
		s += fmt.Sprintf(" %s +%d", se.Set, len(se.Elements))
	}
	return s
}

// nftproxyUpdates loads n services once, then times runs of each kind of
// update through each path. Every update starts from the state the previous
// one left, as in a daemon.
func nftproxyUpdates(res *Results, n, runs int) error {
	return freshNS(func(ns *netns.NS) error {
		conn, err := m.Dial(ns.Fd())
		if err != nil {
			return err
		}
		defer func() { _ = conn.CloseLasting() }()
		u := &updater{ns: ns, conn: conn, snap: snapshot(n, nil)}
		u.applied = proxier.Compile(u.snap, compileConfig)
		if _, err := m.Apply(conn, u.applied); err != nil {
			return err
		}
		type kind struct {
			metric string
			next   func(run int) change
			// neighbour is a service of the same shape as the changed one.
			neighbour func(c change) int
		}
		kinds := []kind{
			{metricEndpointChange, func(run int) change { return u.endpointChange(run, runs) },
				func(c change) int { return c.service - nodePortEvery }},
			{metricServiceAdded, func(int) change { return u.serviceAdded() },
				func(c change) int { return c.service - nodePortEvery }},
		}
		for _, k := range kinds {
			var total, compile, diff, apply, delta, text []float64
			for run := range runs {
				c, d, a, err := u.viaDiff(k.next(run))
				if err != nil {
					return fmt.Errorf("%s: %w", k.metric, err)
				}
				total = append(total, ms(c+d+a))
				compile, diff, apply = append(compile, ms(c)), append(diff, ms(d)), append(apply, ms(a))
			}
			for run := range runs {
				c := k.next(run)
				took, err := u.viaDelta(c, k.neighbour(c))
				if err != nil {
					return fmt.Errorf("%s: %w", k.metric, err)
				}
				delta = append(delta, ms(took))
			}
			for run := range runs {
				took, err := u.viaText(k.next(run))
				if err != nil {
					return fmt.Errorf("%s: %w", k.metric, err)
				}
				text = append(text, ms(took))
			}
			res.add(n, k.metric, methodNftproxy, total...)
			res.add(n, k.metric, methodCompile, compile...)
			res.add(n, k.metric, methodDiff, diff...)
			res.add(n, k.metric, methodApply, apply...)
			res.add(n, k.metric, methodDelta, delta...)
			res.add(n, k.metric, methodNftText, text...)
		}
		return nil
	})
}
