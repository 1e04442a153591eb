package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/e2e"
)

// Files written next to benchmarks.md.
const (
	syncPlot    = "bench-sync.svg"
	updatesPlot = "bench-updates.svg"
	connectPlot = "bench-connect.svg"
)

// The targets, at 10,000 services unless said otherwise.
const (
	targetFullSyncMS   = 500
	targetEndpointMS   = 5
	targetServiceMS    = 20
	targetFullSync50MS = 3000
	targetRSS50MiB     = 150
	targetConnectRatio = 1.10
)

func writeDocs(res *Results, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make docs directory: %w", err)
	}
	if len(res.Records) > 0 {
		if err := res.writePlots(dir); err != nil {
			return err
		}
	}
	if err := res.writePeerPlots(dir); err != nil {
		return err
	}
	path := filepath.Join(dir, "benchmarks.md")
	text := res.markdown()
	// Sections written by hand follow the marker; keep them.
	if old, err := os.ReadFile(path); err == nil {
		if i := bytes.Index(old, []byte(handWritten)); i >= 0 {
			text = strings.TrimRight(text, "\n") + "\n\n" + string(old[i:])
		}
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write benchmarks.md: %w", err)
	}
	return nil
}

// handWritten starts the part of benchmarks.md that the program does not
// generate and keeps as it is.
const handWritten = "<!-- written by hand from here on: cmd/bench keeps it -->\n"

// writePlots draws the plots of the sync, updates and dataplane phases.
func (res *Results) writePlots(dir string) error {
	sync := res.chart("full sync, fresh namespace", metricFullSync, "time (median)",
		[]string{methodNftproxy, methodCompile, methodNftText, methodLegacy, methodIptNft},
		point{10000, targetFullSyncMS}, point{50000, targetFullSync50MS})
	if err := writeSVG(filepath.Join(dir, syncPlot), sync); err != nil {
		return err
	}
	updates := []string{methodNftproxy, methodFullDiff, methodNftText, methodLegacy, methodLegacyPartial, methodIptNft, methodIptNftPartial}
	ep := res.chart("one endpoint changed", metricEndpointChange, "time (median)", updates, point{10000, targetEndpointMS})
	add := res.chart("one service added", metricServiceAdded, "time (median)", updates, point{10000, targetServiceMS})
	if err := writeSVG(filepath.Join(dir, updatesPlot), ep, add); err != nil {
		return err
	}
	conn := res.chart("tcp connect + first byte, client to service", metricConnect, "p50 latency",
		[]string{methodConnNftFirst, methodConnNftLast, methodConnLegacyFirst, methodConnLegacyLast})
	for i := range conn.series {
		conn.series[i].name += " p50"
	}
	if err := writeSVG(filepath.Join(dir, connectPlot), conn); err != nil {
		return err
	}
	return nil
}

// chart plots the medians of metric for methods against the service count.
func (r *Results) chart(title, metric, yLabel string, methods []string, targets ...point) chart {
	c := chart{title: title, xLabel: "services (3 endpoints each)", yLabel: yLabel, yFormat: msLabel}
	for _, method := range methods {
		s := series{name: method, color: methodStyle[method].c, dashed: methodStyle[method].dashed}
		for _, n := range r.Sizes {
			if rec := r.find(n, metric, method); rec != nil && len(rec.Values) > 0 {
				s.xs, s.ys = append(s.xs, float64(n)), append(s.ys, quantile(rec.Values, 0.5))
			}
		}
		if len(s.xs) > 0 {
			c.series = append(c.series, s)
		}
	}
	for _, t := range targets {
		if slices.Contains(r.Sizes, int(t.x)) {
			c.targets = append(c.targets, t)
		}
	}
	return c
}

// fmtMS prints milliseconds with three significant digits and a unit.
func fmtMS(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.2f ms", v)
	default:
		return fmt.Sprintf("%.3f ms", v)
	}
}

func fmtMiB(v float64) string { return fmt.Sprintf("%.0f MiB", v) }

// cell prints a record as "min / median" (one value alone), "not run" when
// it was skipped and "–" when it was not measured.
func (r *Results) cell(n int, metric, method string, format func(float64) string) string {
	rec := r.find(n, metric, method)
	switch {
	case rec == nil:
		return "–"
	case rec.Skip != "":
		return "not run"
	case len(rec.Values) == 1:
		return format(rec.Values[0])
	default:
		return format(slices.Min(rec.Values)) + " / " + format(quantile(rec.Values, 0.5))
	}
}

// ratioCell is the median of one metric over the median of another, of one
// method, as "1.46x".
func (r *Results) ratioCell(n int, over, under, method string) string {
	return ratioText(r.value(n, over, method), r.value(n, under, method), "x")
}

// ratioText prints num/den to two decimals and unit; "–" when either was
// not measured (NaN, or zero).
func ratioText(num, den float64, unit string) string {
	if math.IsNaN(num+den) || num == 0 || den <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f%s", num/den, unit)
}

// median returns the median of a record and whether it was measured.
func (r *Results) median(n int, metric, method string) (float64, bool) {
	rec := r.find(n, metric, method)
	if rec == nil || len(rec.Values) == 0 {
		return 0, false
	}
	return quantile(rec.Values, 0.5), true
}

// value is the median of a record, NaN when it was not measured.
func (r *Results) value(n int, metric, method string) float64 {
	if v, ok := r.median(n, metric, method); ok {
		return v
	}
	return math.NaN()
}

// metricTable has a row per size and a column per method.
func (r *Results) metricTable(metric string, methods []string, format func(float64) string) *e2e.Table {
	t := &e2e.Table{Head: append([]string{"services"}, methods...)}
	for _, n := range r.Sizes {
		row := []string{fmt.Sprint(n)}
		for _, method := range methods {
			row = append(row, r.cell(n, metric, method, format))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func (r *Results) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Benchmarks\n\n")
	if len(r.Records) > 0 {
		r.writeMain(&b, p)
	} else {
		p("Generated by `go run ./cmd/bench`; the raw data is `cmd/bench/results.json`.\n\n")
		r.writeMachine(p)
	}
	r.writePeers(&b)
	if r.Soak != nil {
		r.Soak.writeSoak(&b)
	}
	return b.String()
}

// writeMain writes the sync, updates, dataplane, daemon and gobench phases.
func (r *Results) writeMain(b *strings.Builder, p func(string, ...any)) {
	p("Generated by `make bench` (`go run ./cmd/bench`%s) on %s; the run took %s. ",
		map[bool]string{true: " `--quick`", false: ""}[r.Quick], r.Started.Format("2006-01-02 15:04 UTC"), r.Duration)
	p("Every figure is **minimum / median of %d runs** unless the cell holds one value (one run, said below). ", r.Runs)
	p("Each full sync loads %s services into a fresh network namespace; every service is a TCP ClusterIP with %d ready endpoints, one in %d also has a NodePort. ",
		"N", endpointsPerService, nodePortEvery)
	p("Benchmarks print figures; nothing passes or fails on timing. The raw data is `cmd/bench/results.json`; `go run ./cmd/bench --render cmd/bench/results.json` rewrites this page from it.\n\n")

	r.writeMachine(p)
	r.writeTargets(b)

	p("## Full sync\n\n")
	p("Time from nothing to the whole ruleset in the kernel. *nftproxy* is the daemon's first sync, `proxier.Sync` of the whole snapshot into an empty table: compile, then one `nftnl.Apply` netlink batch, in a child process started for the purpose (split into *compile*, everything before the batch, and *netlink*). *nft -f* loads the same ruleset, rendered by `nftmodel.Render`, through `nft -f -` — what a proxy that shells out to nft (knftables) pays; rendering is not timed. The iptables columns load kube-proxy's iptables-mode ruleset for the same services (`KUBE-SERVICES`, `KUBE-SVC-*` with `statistic` probabilities, `KUBE-SEP-*` with DNAT, `KUBE-MARK-MASQ`, `KUBE-NODEPORTS`, `KUBE-EXT-*`, `KUBE-POSTROUTING`, `KUBE-FORWARD`, in its large-cluster form without per-endpoint comments) with `-w` as kube-proxy does; generating that text is not timed. Tools are timed from fork to exit.\n\n")
	p("![full sync time against services](%s)\n\n", syncPlot)
	r.metricTable(metricFullSync, []string{methodNftproxy, methodCompile, methodApply, methodNftText, methodLegacy, methodIptNft}, fmtMS).Write(b)

	p("### Memory and CPU of nftproxy's full sync\n\n")
	p("Peak RSS (the child's own `VmHWM`; `getrusage` would count the parent it was cloned from) and user+system CPU (`getrusage`) of the child that makes one full sync: it builds the snapshot, compiles and sends the batch, nothing else. The kernel's work on the batch runs in the child's `sendmsg` and counts as its system time. *GOMEMLIMIT=%s* is the same child with Go's soft memory limit set to the target less the 20 MiB the binary itself maps (what a sync of one service holds), which Go does not count; *GOMEMLIMIT=1MiB* makes the collector run all the time, so its peak RSS comes close to the sync's live peak (one run; the collector takes at most half the CPU, so some garbage still piles up); *live heap* is what a collection leaves at each stage (a separate child, so the collections don't skew the timings).\n\n", memLimit)
	mem := &e2e.Table{Head: []string{"services", "peak RSS", "CPU", "GOMEMLIMIT=" + memLimit + ": time", "peak RSS", "GOMEMLIMIT=1MiB: time", "peak RSS", "live heap: snapshot", "+ compiled ruleset", "set elements"}}
	for _, n := range r.Sizes {
		mem.Rows = append(mem.Rows, []string{fmt.Sprint(n),
			r.cell(n, metricFullSyncRSS, methodNftproxy, fmtMiB), r.cell(n, metricFullSyncCPU, methodNftproxy, fmtMS),
			r.cell(n, metricFullSync, methodMemLimit, fmtMS), r.cell(n, metricFullSyncRSS, methodMemLimit, fmtMiB),
			r.cell(n, metricFullSync, methodMemFloor, fmtMS), r.cell(n, metricFullSyncRSS, methodMemFloor, fmtMiB),
			r.cell(n, metricLiveHeap, stageSnapshot, fmtMiB), r.cell(n, metricLiveHeap, stageCompiled, fmtMiB),
			r.cell(n, metricLiveHeap, "elements", func(v float64) string { return fmt.Sprintf("%.0f", v) })})
	}
	mem.Write(b)

	p("## Incremental updates\n\n")
	p("With N services loaded, one change at a time, each starting from the state the previous one left. ")
	p("*nftproxy* is what the daemon does on every change: `proxier.SyncChanges` with the service port that changed, as the tracker hands it over, which compiles that port alone (old and new version) and sends its changes in one batch (`nftnl.ApplyChanges`) over a lasting netlink connection (`nftnl.Dial`); its user-space share (*nftproxy compile*) and its netlink share follow. ")
	p("*full compile + diff* is the path the incremental compiler replaced, kept for comparison: `proxier.Compile` of the whole new snapshot, `nftmodel.Diff` against the whole applied ruleset, the same `ApplyChanges`. ")
	p("*nft -f* sends the same diff as an nft script through the nft binary; building the diff and the script is not timed, so compare it with the *nftproxy netlink* column: both are only the trip to the kernel. ")
	p("For iptables, *restore* is kube-proxy's full sync (every chain rewritten, `--noflush`) and *--noflush* its partial sync (the top-level chains, `KUBE-SERVICES` with its N rules included, plus the changed service's chains). ")
	p("*One endpoint changed*: the last endpoint address of one service replaced by another (the count stays %d; the stale `KUBE-SEP` chain is deleted in the same restore). *One service added*: a service with %d endpoints.\n\n", endpointsPerService, endpointsPerService)
	p("![update latency against services](%s)\n\n", updatesPlot)
	updateMethods := []string{methodNftproxy, methodCompile, methodApply, methodFullDiff, methodNftText, methodLegacy, methodLegacyPartial, methodIptNft, methodIptNftPartial}
	p("### One endpoint changed\n\n")
	r.metricTable(metricEndpointChange, updateMethods, fmtMS).Write(b)
	p("### One service added\n\n")
	r.metricTable(metricServiceAdded, updateMethods, fmtMS).Write(b)

	r.writeDataplane(p, b)

	p("## The daemon\n\n")
	p("`nftproxy run --manifests DIR` (the binary `make build` makes) in a fresh namespace, on the same services and their EndpointSlices in two manifest files (the middle service alone in the second), with `--sync-period %s`. *Start-up* runs from exec to the first sync logged (reading and decoding the YAML included); *first sync* is that sync alone, as the daemon logs it (`took`, both families' tables: the figure of `nftproxy_sync_duration_seconds`); *one endpoint replaced* is the median of %d delta syncs, each logged after the second file was rewritten with the middle service's last endpoint replaced (and back); RSS (`/proc/PID/status`) is read a second after the first sync and again a second after %d periodic resyncs (*steady state*; a resync is skipped when nothing committed to nftables since the last sync, as here); *peak* is the highest `VmHWM` read, every 20 ms until steady state (a later reading can come out lower than an earlier one); *peak, decoding* is that figure when the daemon logs that it loaded the manifests, before the first sync (which starts at once, so up to one poll of it may count); *peak / steady* is the peak over the RSS at steady state (issue 11 asks at most 1.5); *Go heap* is the daemon's own `go_memstats_heap_alloc_bytes` from its `/metrics` at steady state (garbage not yet collected included); *release* is the collection that gives the first sync's garbage back to the OS (`debug.FreeOSMemory`, as the daemon logs it).\n\n", daemonSyncPeriod, daemonEndpointSteps, daemonResyncs)
	d := &e2e.Table{Head: []string{"services", "start-up to first sync", "first sync", "one endpoint replaced: sync", "RSS after the first sync", "RSS at steady state", "peak, decoding", "peak RSS", "peak / steady", "Go heap", "release"}}
	for _, eps := range []int{endpointsPerService, 1} {
		m := func(method string) string { return daemonMethod(method, eps) }
		for _, n := range r.measuredSizes(metricDaemonRSS, m(methodDaemon)) {
			label := fmt.Sprint(n)
			if eps != endpointsPerService {
				label = fmt.Sprintf("%d, %d endpoint each", n, eps)
			}
			d.Rows = append(d.Rows, []string{label, r.cell(n, metricDaemonStart, m(methodDaemon), fmtMS),
				r.cell(n, metricDaemonFullSync, m(methodDaemon), fmtMS), r.cell(n, metricDaemonEndpoint, m(methodDaemon), fmtMS),
				r.cell(n, metricDaemonRSS, m(methodDaemonFirst), fmtMiB), r.cell(n, metricDaemonRSS, m(methodDaemon), fmtMiB),
				r.cell(n, metricDaemonPeak, m(methodDaemonLoaded), fmtMiB), r.cell(n, metricDaemonPeak, m(methodDaemon), fmtMiB),
				r.ratioCell(n, metricDaemonPeak, metricDaemonRSS, m(methodDaemon)),
				r.cell(n, metricDaemonHeap, m(methodDaemon), fmtMiB), r.cell(n, metricDaemonRelease, m(methodDaemon), fmtMS)})
		}
	}
	d.Write(b)

	r.writeGoBench(p, b)
	r.writeSkipped(p)
	r.writeAnalysis(p)
}

func (r *Results) writeMachine(p func(string, ...any)) {
	mc := r.Machine
	p("## Machine\n\n")
	p("| | |\n|---|---|\n")
	p("| CPU | %s, %d cores |\n| memory | %d MiB |\n| kernel | Linux %s |\n| OS | %s |\n| Go | %s |\n",
		mc.CPU, mc.CPUs, mc.MemoryMi, mc.Kernel, mc.OS, mc.Go)
	p("| google/nftables | %s |\n", mc.Nftables)
	for _, tool := range benchTools {
		p("| %s | %s |\n", tool[0], strings.ReplaceAll(mc.Tools[tool[0]], "\n", " "))
	}
	if len(r.Load) > 0 {
		p("| load average (1, 5, 15 min) | %s |\n", strings.Join(r.Load, " before, ")+" after")
	}
	p("\nThe machine is shared: other work running at the same time shows in the medians and most in the p99s; minimums are the least disturbed figures.\n\n")
}

func (r *Results) writeTargets(b *strings.Builder) {
	fmt.Fprintf(b, "## Targets\n\n")
	t := &e2e.Table{Head: []string{"target", "measured (median)", "result"}}
	check := func(name string, v, limit float64, format func(float64) string) {
		if math.IsNaN(v) {
			t.Rows = append(t.Rows, []string{name, "not measured", "size not in this run (a run without --quick has it)"})
			return
		}
		verdict := "**met**"
		if v > limit {
			verdict = fmt.Sprintf("**missed**, %.1f× the target", v/limit)
		}
		t.Rows = append(t.Rows, []string{name, format(v), verdict})
	}
	check("full sync, 10,000 services ≤ 0.5 s", r.value(10000, metricFullSync, methodNftproxy), targetFullSyncMS, fmtMS)
	check("one endpoint changed, 10,000 services ≤ 5 ms end to end",
		r.value(10000, metricEndpointChange, methodNftproxy), targetEndpointMS, fmtMS)
	check("one service added, 10,000 services ≤ 20 ms", r.value(10000, metricServiceAdded, methodNftproxy), targetServiceMS, fmtMS)
	check("full sync, 50,000 services ≤ 3 s", r.value(50000, metricFullSync, methodNftproxy), targetFullSync50MS, fmtMS)
	check("… with peak RSS ≤ 150 MiB", r.value(50000, metricFullSyncRSS, methodNftproxy), targetRSS50MiB, fmtMiB)
	check("… with peak RSS ≤ 150 MiB, Go's soft memory limit at "+memLimit+" (time in the memory table)",
		r.value(50000, metricFullSyncRSS, methodMemLimit), targetRSS50MiB, fmtMiB)
	check("connect p50 to the last service within 10% of the first, 30,000 services",
		r.value(30000, metricConnect, methodConnNftLast)/r.value(30000, metricConnect, methodConnNftFirst),
		targetConnectRatio, func(v float64) string { return fmt.Sprintf("last/first = %.2f", v) })
	t.Write(b)
}

func (r *Results) writeDataplane(p func(string, ...any), b *strings.Builder) {
	p("## Dataplane: connecting to the first and the last service\n\n")
	p("A client namespace connects through the node namespace (where the rules are) to three pod namespaces on a bridge (`e2e/netns.BuildTopology`). The first- and the last-created service point at the real pods; every other service has endpoints of its own. Each sample is a TCP connect to the ClusterIP plus reading the first line the pod's server sends (DNAT, masquerade, a forwarded handshake and the first byte back), taken in turn for the two services, after %d warm-up connects. The iptables rows load kube-proxy's ruleset (legacy backend) into the same node namespace instead. kube-proxy writes `KUBE-SERVICES` in its own service order; here it is creation order, so the last service's rule is the last of N that the first packet of a connection walks past.\n\n", warmupConnects)
	p("![connect latency against services](%s)\n\n", connectPlot)
	t := &e2e.Table{Head: []string{"services", "samples", "nftproxy first: p50 / p99", "nftproxy last: p50 / p99", "last/first p50",
		"iptables first: p50 / p99", "iptables last: p50 / p99", "last/first p50"}}
	q := func(n int, method string) (string, float64, int) {
		rec := r.find(n, metricConnect, method)
		if rec == nil || len(rec.Values) == 0 {
			return "–", 0, 0
		}
		p50 := quantile(rec.Values, 0.5)
		return fmtMS(p50) + " / " + fmtMS(quantile(rec.Values, 0.99)), p50, len(rec.Values)
	}
	for _, n := range r.Sizes {
		nf, nfv, samples := q(n, methodConnNftFirst)
		nl, nlv, _ := q(n, methodConnNftLast)
		lf, lfv, _ := q(n, methodConnLegacyFirst)
		ll, llv, _ := q(n, methodConnLegacyLast)
		t.Rows = append(t.Rows, []string{fmt.Sprint(n), fmt.Sprint(samples), nf, nl, ratioText(nlv, nfv, ""), lf, ll, ratioText(llv, lfv, "")})
	}
	t.Write(b)
}

func (r *Results) writeGoBench(p func(string, ...any), b *strings.Builder) {
	if len(r.GoBench) == 0 {
		return
	}
	p("## Go benchmarks\n\n")
	p("`go test -run '^$' -bench . -benchmem -benchtime 3x ./proxier/` (in `proxier/bench_test.go`, same services as above): the user-space share of a sync. *Compile* is a full sync's compile; *Diff* compares two whole compiled rulesets (kept for tools and tests; the daemon no longer diffs whole rulesets); *Sync* is `proxier.SyncChanges` of one change, given the changed service port as the tracker hands it over, with a kernel that does nothing — the incremental compiler's whole share of an update.\n\n")
	t := &e2e.Table{Head: []string{"benchmark", "time/op", "memory/op", "allocations/op"}}
	for _, g := range r.GoBench {
		t.Rows = append(t.Rows, []string{"`" + g.Name + "`", fmtMS(g.NsPerOp / 1e6), fmtBytes(g.BytesPerOp), fmt.Sprintf("%.0f", g.AllocsPerOp)})
	}
	t.Write(b)
}

func (r *Results) writeSkipped(p func(string, ...any)) {
	p("## What was not run, and why\n\n")
	p("The budget is a full run in about 15 minutes on this 2-core machine. iptables-nft-restore is the slow one: a full-table restore (kube-proxy's full sync) took 31–59 s per update at 5,000 services when tried here (78 s at 10,000), so its updates are timed only up to the sizes below, with one run; its full loads take one run above 10,000 services. iptables-legacy updates take one run above 10,000 services.\n\n")
	for _, rec := range r.Records {
		if rec.Skip != "" {
			p("- %s, %s, %d services: %s\n", rec.Metric, rec.Method, rec.N, rec.Skip)
		}
	}
	p("\n")
}

// writeAnalysis explains the targets from the figures of this run.
func (r *Results) writeAnalysis(p func(string, ...any)) {
	p("## Why, and what would meet the missed targets\n\n")
	n := 10000
	if !slices.Contains(r.Sizes, n) {
		n = r.largest(metricEndpointChange, methodNftproxy)
	}
	if math.IsNaN(r.value(n, metricEndpointChange, methodNftproxy)) {
		r.writeFullSyncAnalysis(p)
		r.writeDataplaneAnalysis(p)
		return
	}
	big := r.largest(metricEndpointChange, methodCompile)
	p("**Updates.** At %d services one endpoint change costs %s end to end: %s in user space and %s in the kernel; the path it replaced (whole compile and diff) takes %s. ",
		n, fmtMS(r.value(n, metricEndpointChange, methodNftproxy)), fmtMS(r.value(n, metricEndpointChange, methodCompile)),
		fmtMS(r.value(n, metricEndpointChange, methodApply)), fmtMS(r.value(n, metricEndpointChange, methodFullDiff)))
	p("User space does no O(N) work for an O(1) change: the tracker hands over the service ports an event touched (`k8s.Changes`), and `proxier` compiles only those, old and new version (their elements of the shared maps and their own chains and sets), and builds `nftmodel.Changes` from the two; the chains and slot maps service ports share, and the `hairpin` and `cluster-ips` elements, are reference counted so they go only with their last user. Its share is %s at %d services and %s at %d. ",
		fmtMS(r.value(n, metricEndpointChange, methodCompile)), n, fmtMS(r.value(big, metricEndpointChange, methodCompile)), big)
	p("The ruleset's shape does the rest: an endpoint change touches only data-map elements, so the kernel checks no jumps and its share stays at %s even at %d services. ",
		fmtMS(r.value(big, metricEndpointChange, methodApply)), big)
	p("Adding a service puts an element with a `goto` into `service-ips`, which makes the kernel validate the table's jump graph again: %s at %d services, %s at %d. ",
		fmtMS(r.value(n, metricServiceAdded, methodApply)), n, fmtMS(r.value(big, metricServiceAdded, methodApply)), big)
	p("Full syncs (the first, after a failure, and the periodic drift repair) still compile everything; `go test -bench Sync ./proxier/` prints the user-space share of an update alone.\n\n")

	n50 := 50000
	if slices.Contains(r.Sizes, n50) {
		p("**Memory at 50,000 services.** The sync's peak RSS is %s with Go's defaults, while its live heap after compiling is %s (the snapshot's %s included): GOGC=100 lets garbage grow to about the live heap between collections. With a soft memory limit of %s the same sync peaks at %s and takes %s instead of %s; collecting all the time (`GOMEMLIMIT=1MiB`) it peaks at %s. ",
			fmtMiB(r.value(n50, metricFullSyncRSS, methodNftproxy)), fmtMiB(r.value(n50, metricLiveHeap, stageCompiled)), fmtMiB(r.value(n50, metricLiveHeap, stageSnapshot)),
			memLimit, fmtMiB(r.value(n50, metricFullSyncRSS, methodMemLimit)), fmtMS(r.value(n50, metricFullSync, methodMemLimit)),
			fmtMS(r.value(n50, metricFullSync, methodNftproxy)), fmtMiB(r.value(n50, metricFullSyncRSS, methodMemFloor)))
		p("Three changes brought the live peak down to what the sync must hold (the snapshot, the model and one copy of the batch; the floor was 241 MiB before them): compile sorts no set (it sorted copies with a key slice per element, which made its peak; `Render` now sorts only what it prints); set elements are no longer converted to google/nftables values for the whole batch up front; and the batch is written into one buffer sized for it, set elements encoded straight into it and only the few dozen table, chain, rule and set messages encoded by google/nftables and copied in, then sent on a socket of our own, where google/nftables kept every encoded message and mdlayher/netlink copied them into a growing buffer (`nftmodel/nftnl/wire.go`; `TestWireElementsMatchLibrary` checks the bytes against the library's). ")
		p("The daemon sets Go's soft memory limit to 90%% of its container's cgroup limit; what a container needs is set by the daemon as a whole (below), not by the sync alone.\n\n")
	}
	if nd := r.largest(metricDaemonRSS, methodDaemon); r.find(nd, metricDaemonRSS, methodDaemon) != nil {
		p("**The daemon** keeps, between syncs, the tracker's entries (what it derived from each Service and EndpointSlice, not the objects; a port's endpoints share its slice's list when it has one slice, and the ports of the last snapshot serve as the merged state), the snapshot and the incremental compiler's state (reference counts, slot orders, the pieces of service ports with many endpoints); with `--manifests`, only the keys of what each file yielded (a broken file's last good objects stay in the tracker; a file that defines again an object of an earlier file keeps its last good content while it does, for when the earlier one drops it). At %d services: %s resident at steady state, its Go heap %s. Start-up decodes with the collector at 25%% (`GOGC` overrides it) and hands the objects over as they decode, then gives the garbage back before the first sync; after a full sync it gives the sync's back too (`debug.FreeOSMemory`, %s at this size). The peak, %s (%s the steady RSS), is the first full sync's: it holds its snapshot, the ruleset it assembles and the batch beside everything the daemon keeps. It assembles the ruleset one service port at a time, keeping of each piece only what the ruleset is made of, and a full sync runs under a soft memory limit of 1.4 times the memory the runtime holds as it starts (`GOGC` overrides it): at Go's default the heap grew to twice the state before the sync's first collection. The endpoint maps', hairpin and cluster-IP sets' elements are made while the batch is encoded, never held as a model (`nftmodel.Set.Source`; `go test -run - -bench FirstSyncMemory ./proxier/` prints the model's share); `go run ./cmd/bench --phases daemon --daemon-profiles DIR` saves the daemon's heap profile at steady state.\n\n",
			nd, fmtMiB(r.value(nd, metricDaemonRSS, methodDaemon)), fmtMiB(r.value(nd, metricDaemonHeap, methodDaemon)),
			fmtMS(r.value(nd, metricDaemonRelease, methodDaemon)), fmtMiB(r.value(nd, metricDaemonPeak, methodDaemon)),
			r.ratioCell(nd, metricDaemonPeak, metricDaemonRSS, methodDaemon))
	}
	r.writeFullSyncAnalysis(p)
	r.writeDataplaneAnalysis(p)
}

func (r *Results) writeFullSyncAnalysis(p func(string, ...any)) {
	big := r.largest(metricFullSync, methodNftproxy)
	nft, legacyMS, iptNftMS := r.value(big, metricFullSync, methodNftText), r.value(big, metricFullSync, methodLegacy), r.value(big, metricFullSync, methodIptNft)
	own := r.value(big, metricFullSync, methodNftproxy)
	p("**Full syncs.** At %d services nftproxy loads everything in %s (compile %s, netlink %s); the same ruleset through `nft -f` takes %s, kube-proxy's iptables ruleset %s with iptables-legacy-restore",
		big, fmtMS(own), fmtMS(r.value(big, metricFullSync, methodCompile)), fmtMS(r.value(big, metricFullSync, methodApply)), fmtMS(nft), fmtMS(legacyMS))
	if !math.IsNaN(iptNftMS) {
		p(" and %s with iptables-nft-restore", fmtMS(iptNftMS))
	}
	p(". The shared dispatch maps and per-slot data maps make nftproxy's table %.0f set elements and a few dozen rules, where kube-proxy's has %d rules per service in %d chains per service (one per endpoint and one for the service), so the kernel has far less to build and check. `nft -f` sends an equivalent batch but parses and evaluates the text first.\n\n",
		r.value(big, metricLiveHeap, "elements"), 2+3*endpointsPerService, 1+endpointsPerService)
}

func (r *Results) writeDataplaneAnalysis(p func(string, ...any)) {
	n := 30000
	if !slices.Contains(r.Sizes, n) {
		n = r.largest(metricConnect, methodConnNftFirst)
	}
	nf, nl := r.value(n, metricConnect, methodConnNftFirst), r.value(n, metricConnect, methodConnNftLast)
	lf, ll := r.value(n, metricConnect, methodConnLegacyFirst), r.value(n, metricConnect, methodConnLegacyLast)
	if math.IsNaN(nf + nl + lf + ll) {
		return
	}
	p("**Dataplane.** At %d services the median connect takes %s to the first service and %s to the last with nftproxy (%+.0f%%): a packet costs a few hash lookups whatever N is. With kube-proxy's iptables ruleset it is %s and %s (%+.0f%%): the first packet of each connection walks `KUBE-SERVICES` rule by rule, so the last service pays for all N rules before it.\n",
		n, fmtMS(nf), fmtMS(nl), (nl/nf-1)*100, fmtMS(lf), fmtMS(ll), (ll/lf-1)*100)
}

// fmtBytes prints a size in the unit that suits it.
func fmtBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
