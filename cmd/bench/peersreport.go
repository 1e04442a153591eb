package main

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/e2e"
)

// The ratios: nftproxy's figure over the fastest kube-proxy mode's.
var peerTargets = []struct {
	metric, title string
	limit         float64
}{
	{peerFullSync, "full sync", 0.1},
	{peerEndpoint, "one-endpoint-change sync", 0.01},
	{peerEndpointWal, "endpoint change, API write to kernel", 0.01},
	{peerServiceWall, "service add, API write to kernel", 0.02},
	{peerEndpointOwn, "endpoint change, own share", 0.02},
	{peerServiceOwn, "service add, own share", 0.05},
}

// peerColumns are the per-workload table's figures, in order.
var peerColumns = []struct {
	metric, title string
	format        func(float64) string
}{
	{peerStart, "start to synced", fmtMS},
	{peerFullSync, "full sync", fmtMS},
	{peerEndpoint, "endpoint replaced: sync", fmtMS},
	{peerEndpointWal, "… API write to kernel", fmtMS},
	{peerService, "service added: sync", fmtMS},
	{peerServiceWall, "… API write to kernel", fmtMS},
	{peerRSS, "RSS", fmtMiB},
	{peerPeak, "peak RSS", fmtMiB},
}

// peerPlotGroups are the bars of a workload's plot.
var peerPlotGroups = []struct{ metric, label string }{
	{peerFullSync, "full sync"},
	{peerEndpoint, "endpoint: sync"},
	{peerEndpointWal, "endpoint: wall"},
	{peerService, "service: sync"},
	{peerServiceWall, "service: wall"},
}

func peerPlotFile(workload string) string { return "bench-peers-" + workload + ".svg" }

// cell prints a figure, "> 5 min" for a step stopped at the limit, "failed"
// for one that failed, "–" when not run.
func (p *PeerRun) cell(workload, proxy, metric string, format func(float64) string) string {
	r := p.find(workload, proxy, metric)
	switch {
	case r == nil:
		return "–"
	case r.Skip == overLimit:
		return p.limitText()
	case strings.HasPrefix(r.Skip, notMeasured):
		return "not run"
	case failedSkip(r.Skip):
		return "failed¹"
	}
	var notes []string
	if r.Syncs > 1 {
		notes = append(notes, fmt.Sprintf("%d syncs", r.Syncs))
	}
	if len(r.Samples) > 1 {
		lo, hi := slices.Min(r.Samples), slices.Max(r.Samples)
		notes = append(notes, fmt.Sprintf("median of %d, %s–%s", len(r.Samples), format(lo), format(hi)))
	}
	if len(notes) == 0 {
		return format(r.Value)
	}
	return fmt.Sprintf("%s (%s)", format(r.Value), strings.Join(notes, "; "))
}

// failedSkip tells whether a record's skip reason is a failure (the cell
// "failed¹", explained under the table), not the limit or a step not run.
func failedSkip(skip string) bool {
	return skip != "" && skip != overLimit && !strings.HasPrefix(skip, notMeasured)
}

// quotient is a proxy's figure over the fastest kube-proxy mode's.
type quotient struct {
	num, den float64
	mode     string // the fastest mode
	over     bool   // no mode finished: den is the limit, a lower bound
	ok       bool   // both figures are there
}

// overKube returns proxy's figure over the smallest of kube-proxy's modes.
// A mode stopped at the limit counts as the limit.
func (p *PeerRun) overKube(workload, proxy, metric string) quotient {
	q := quotient{den: math.Inf(1)}
	for _, kp := range kubeProxies {
		r := p.find(workload, kp, metric)
		switch {
		case r == nil:
		case r.Skip == overLimit:
			if math.IsInf(q.den, 1) {
				q.den, q.mode, q.over = p.LimitMS, kp, true
			}
		case r.Skip == "":
			if r.Value < q.den || q.over {
				q.den, q.mode, q.over = r.Value, kp, false
			}
		}
	}
	q.num, q.ok = p.value(workload, proxy, metric)
	q.ok = q.ok && q.mode != "" && q.den > 0
	return q
}

func (q quotient) String() string {
	switch {
	case !q.ok:
		return "–"
	case q.over:
		return fmt.Sprintf("< %.3g", q.num/q.den)
	}
	return fmt.Sprintf("%.3g", q.num/q.den)
}

// withFigures prints the quotient with both figures and the mode's name.
func (q quotient) withFigures(mode string) string {
	if !q.ok {
		return "–"
	}
	return fmt.Sprintf("%s (%s / %s%s, %s)", q, fmtMS(q.num), map[bool]string{true: "> "}[q.over], fmtMS(q.den), mode)
}

// ratio prints nftproxy's figure over the fastest kube-proxy mode's, with
// both figures, and whether it meets limit.
func (p *PeerRun) ratio(workload, metric string, limit float64) (text string, verdict string) {
	q := p.overKube(workload, proxyNftproxy, metric)
	switch {
	case !q.ok:
		return "–", ""
	case q.num/q.den > limit:
		verdict = "**missed**"
	default:
		verdict = "met"
	}
	return q.withFigures(strings.TrimPrefix(proxyTitle[q.mode], "kube-proxy ")), verdict
}

// workloadTable has a row for each workload that row gives cells for.
func (p *PeerRun) workloadTable(head []string, row func(PeerWorkload) []string) *e2e.Table {
	t := &e2e.Table{Head: head}
	for _, wl := range p.Workloads {
		if cells := row(wl); cells != nil {
			t.Rows = append(t.Rows, append([]string{wl.Name}, cells...))
		}
	}
	return t
}

// anyFigure tells whether a row has a cell other than "–".
func anyFigure(cells []string) bool {
	return slices.ContainsFunc(cells, func(c string) bool { return c != "–" })
}

func (r *Results) writePeers(b *strings.Builder) {
	p := r.Peers
	if p == nil || len(p.Workloads) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Against kube-proxy\n\n")
	w("`go run ./cmd/bench --phases peers` (part of `make bench`; `--workloads` and `--proxies` run it in pieces, each piece merged into the results, so figures of one table may come from different pieces; the last piece ran on %s%s and took %s, load average %s). ",
		p.Started.Format("2006-01-02 15:04 UTC"), map[bool]string{true: " with `--quick`", false: ""}[p.Quick], p.Duration, strings.Join(p.Load, " before, ")+" after")
	w("For each workload a fresh etcd and kube-apiserver %s (on 127.0.0.1) get the workload written through client-go: Services with their ClusterIPs, EndpointSlices of at most %d ready endpoints written directly (managed-by `%s`, so no controller touches them), addresses in 10.0.0.0/8 that no packet ever goes to, each endpoint on one of %d nodes (`nodeName` node-1 to node-%d, by address), and the Node every proxy runs as, %s, which holds one endpoint in %d. ",
		"v1.36.3", sliceSize, benchManagedBy, peerNodes, peerNodes, benchNode, peerNodes)
	w("Then each proxy runs alone in a fresh network namespace, reaching the API server through a relay the bench listens with inside the namespace (the root namespace gets no interface, address or rule): kube-proxy v1.36.3 with `--proxy-mode=nftables`, with `--proxy-mode=iptables` and `iptables` on its PATH linked to `xtables-nft-multi` (the nft backend) or to `xtables-legacy-multi`, and `nftproxy run --kubeconfig`. ")
	w("Every proxy gets a sync period of an hour (no periodic resync in the window) and keeps its default 1 s min-sync-period; kube-proxy leaves conntrack sysctls alone (`--conntrack-max-per-core=0`).\n\n")
	w("- **full sync** and the **sync** columns are the proxy's own `%s` (its IPv4 series: kube-proxy runs an IPv6 proxier beside it, which times its own table; nftproxy syncs both tables at once, each series counting its own table's share and the steps both need, so the IPv6 table is not in the IPv4 figure; the whole sync is under each workload's table): the first sample for the full sync, and what the step added until the histogram stood still for %s for the others (a cell says so when that was more than one sync).\n", syncMetric, settle)
	w("- **API write to kernel** runs from just before the client-go write (the EndpointSlice update with one address replaced; the Service create, its EndpointSlice written before the proxy started) to the moment the change is in the kernel: for the nf_tables proxies the namespace's nf_tables notification (`NFNLGRP_NFTABLES`) that names the new address, which the kernel sends as it commits the batch; for iptables-legacy, which has no notifications, the first `iptables-legacy-save -t nat` that shows the new rule (polled back to back, so the figure is late by up to one save).\n")
	w("- **%s**: during every proxy's two steps the bench keeps a client-go watch of its own on the object the step writes (protobuf, straight to the API server, where the proxies go through the relay), and times the write to the event's arrival, median over every proxy's runs: what the API server takes to store a write and hand it to a watcher, under every proxy's API write to kernel figure.\n", proxyTitle[proxyAPIWatch])
	w("- **start to synced** is from exec to the first sample seen (scraped every %s); **RSS** is VmRSS once the full sync settled, **peak RSS** VmHWM after the last step.\n", scrapeEvery)
	w("- A proxy that has not finished a step after %s is reported `%s` and killed; its later steps are not run. Everything (namespace, API server, etcd data) is removed afterwards.\n\n", strings.TrimPrefix(p.limitText(), "> "), p.limitText())

	r.writePeerTargets(w, b)
	r.writePeerFloor(w, b)
	r.writePeerOwnShare(w, b)

	r.writePeerScaling(w, b)

	var failures []string
	for _, wl := range p.Workloads {
		failures = append(failures, p.writeWorkload(w, b, wl)...)
	}
	if len(failures) > 0 {
		w("¹ Failed:\n\n")
		for _, f := range failures {
			w("- %s\n", f)
		}
		w("\n")
	}
}

// writePeerTargets prints the ratios for every workload.
func (r *Results) writePeerTargets(w func(string, ...any), b *strings.Builder) {
	p := r.Peers
	w("### nftproxy against the fastest kube-proxy mode\n\n")
	w("Each cell: nftproxy's figure over the fastest kube-proxy mode's for that figure (the issue's limit in the header), with both figures and the mode. A mode stopped at the time limit counts as the limit, so a ratio against it is an upper bound (`<`).\n\n")
	head := []string{"workload"}
	for _, tg := range peerTargets {
		head = append(head, fmt.Sprintf("%s (≤ %g×)", tg.title, tg.limit))
	}
	p.workloadTable(head, func(wl PeerWorkload) (row []string) {
		for _, tg := range peerTargets {
			text, verdict := p.ratio(wl.Name, tg.metric, tg.limit)
			switch {
			case wl.NotLoaded != "":
				text = "not run (below)"
			case verdict != "":
				text += " " + verdict
			}
			row = append(row, text)
		}
		return row
	}).Write(b)
}

// writeWorkload prints one workload's table and plot, and returns the
// failures its cells point to.
func (p *PeerRun) writeWorkload(w func(string, ...any), b *strings.Builder, wl PeerWorkload) (failures []string) {
	w("### %s\n\n", wl.Title)
	if wl.NotLoaded != "" {
		w("%d services, %d endpoints, %d EndpointSlices. %s The section *API server write rate* below says why; the daemon section above has nftproxy at this size from a manifest directory.\n\n",
			wl.Services, wl.Endpoints, wl.Slices, wl.NotLoaded)
		return nil
	}
	w("%d services, %d endpoints, %d EndpointSlices, written in %d s.\n\n", wl.Services, wl.Endpoints, wl.Slices, wl.CreateS)
	t := &e2e.Table{Head: []string{"proxy"}}
	for _, c := range peerColumns {
		t.Head = append(t.Head, c.title)
	}
	for _, proxy := range append(slices.Clone(allProxies), proxyAPIWatch) {
		var row []string
		for _, c := range peerColumns {
			row = append(row, p.cell(wl.Name, proxy, c.metric, c.format))
			if r := p.find(wl.Name, proxy, c.metric); r != nil && failedSkip(r.Skip) {
				failures = append(failures, fmt.Sprintf("%s, %s, %s: %s", wl.Name, proxyTitle[proxy], c.title, r.Skip))
			}
		}
		if anyFigure(row) {
			t.Rows = append(t.Rows, append([]string{proxyTitle[proxy]}, row...))
		}
	}
	row := []string{"nftproxy / fastest kube-proxy"}
	for _, c := range peerColumns {
		row = append(row, p.overKube(wl.Name, proxyNftproxy, c.metric).String())
	}
	t.Rows = append(t.Rows, row)
	t.Write(b)
	if p.find(wl.Name, proxyNftproxy, peerFullWhole) != nil {
		w("nftproxy's full sync above is its IPv4 series, as kube-proxy's; the whole first sync, with the empty IPv6 table that kube-proxy's second proxier syncs apart (`%s`): %s.\n\n",
			wholeSyncMetric, p.cell(wl.Name, proxyNftproxy, peerFullWhole, fmtMS))
	}
	w("![%s](%s)\n\n", wl.Title, peerPlotFile(wl.Name))
	return failures
}

// writePeerFloor prints the API server's own share of the API write to
// kernel figures: what a proxy that took no time at all would score.
func (r *Results) writePeerFloor(w func(string, ...any), b *strings.Builder) {
	p := r.Peers
	head := []string{"workload", "endpoint change: bare watch / fastest kube-proxy", "service add: bare watch / fastest kube-proxy"}
	t := p.workloadTable(head, func(wl PeerWorkload) []string {
		var row []string
		for _, metric := range []string{peerEndpointWal, peerServiceWall} {
			q := p.overKube(wl.Name, proxyAPIWatch, metric)
			row = append(row, q.withFigures(proxyTitle[q.mode]))
		}
		if !anyFigure(row) {
			return nil
		}
		return row
	})
	if len(t.Rows) == 0 {
		return
	}
	w("The API write to kernel figures include the API server's own work. A bare watch on the changed object (the row *%s* in each workload's table) receives the write this long after it was made, over the fastest kube-proxy mode's figure: no proxy can score below this.\n\n", proxyTitle[proxyAPIWatch])
	t.Write(b)
}

// writePeerOwnShare prints each proxy's own share of the API write to
// kernel: from the bare watch's event on the same write to the kernel.
func (r *Results) writePeerOwnShare(w func(string, ...any), b *strings.Builder) {
	p := r.Peers
	proxies := append([]string{proxyNftproxy}, kubeProxies...)
	var tables []*e2e.Table
	for _, step := range []struct{ metric, sync, title string }{{peerEndpointOwn, peerEndpoint, "endpoint change"}, {peerServiceOwn, peerService, "service add"}} {
		head := []string{step.title + ": workload"}
		for _, proxy := range proxies {
			head = append(head, proxyTitle[proxy])
		}
		head = append(head, "nftproxy / fastest kube-proxy", "nftproxy's share: its sync + the rest")
		t := p.workloadTable(head, func(wl PeerWorkload) []string {
			own, ok := p.value(wl.Name, proxyNftproxy, step.metric)
			if !ok {
				return nil
			}
			var row []string
			for _, proxy := range proxies {
				row = append(row, p.cell(wl.Name, proxy, step.metric, fmtMS))
			}
			// nftproxy's share as its sync (compile and the netlink
			// commit, from its histogram) plus the rest.
			split := "–"
			if sync, ok := p.value(wl.Name, proxyNftproxy, step.sync); ok {
				split = fmt.Sprintf("%s + %s", fmtMS(sync), fmtMS(max(0, own-sync)))
			}
			text, _ := p.ratio(wl.Name, step.metric, 0)
			return append(row, text, split)
		})
		if len(t.Rows) > 0 {
			tables = append(tables, t)
		}
	}
	if len(tables) == 0 {
		return
	}
	w("### The proxy's own share\n\n")
	w("Each proxy's API write to kernel figure minus what the API server took: during every proxy's steps the bench keeps a bare watch of its own on the object each step writes (the row *%s*), and a cell is from that watch's event to the change in the kernel, on the same write in the same run. This is the part a proxy controls: its watch's decoding, its own work, and the kernel's commit. (The proxies' watches go through the relay, the bench's does not, so a share includes the relay's hop; for iptables-legacy the kernel time is late by up to one save, as above.) The last column splits nftproxy's share (medians of its runs) into its sync, from its histogram as in the sync columns, which holds the compile and the netlink commit, and the rest: the relay, decoding the watch event, the tracker, and the sync loop's wake-up. A service add's sync is mostly the kernel's: adding a `goto` to a verdict map makes the commit validate every verdict map element the table's rules reach (docs/design.md, \"What a service add costs the kernel\").\n\n", proxyTitle[proxyAPIWatch])
	for _, t := range tables {
		t.Write(b)
	}
}

// writePeerScaling prints nftproxy's endpoint change against the number of
// services (3 endpoints each): through the API server where the peers phase
// loaded the workload, and from a manifest directory (the daemon phase),
// which reaches sizes the API server cannot store in reasonable time.
func (r *Results) writePeerScaling(w func(string, ...any), b *strings.Builder) {
	p := r.Peers
	sizes := map[int]bool{}
	api := map[int][2]float64{} // sync, wall
	for _, name := range []string{"1kx3", "10kx3", "30kx3", "100kx3"} {
		wl := p.workload(name)
		sync, ok := p.value(name, proxyNftproxy, peerEndpoint)
		if wl == nil || !ok {
			continue
		}
		wall, ok := p.value(name, proxyNftproxy, peerEndpointWal)
		if !ok {
			wall = math.NaN()
		}
		sizes[wl.Services], api[wl.Services] = true, [2]float64{sync, wall}
	}
	for _, n := range r.measuredSizes(metricDaemonEndpoint, methodDaemon) {
		sizes[n] = true
	}
	if len(sizes) == 0 {
		return
	}
	cell := func(v float64, ok bool) string {
		if !ok || math.IsNaN(v) {
			return "–"
		}
		return fmtMS(v)
	}
	apiBase := api[10000] // zero when not measured: no ratio
	dirBase, _ := r.median(10000, metricDaemonEndpoint, methodDaemon)
	t := &e2e.Table{Head: []string{"services (× 3 endpoints)", "API server: sync", "… API write to kernel", "… sync / 10k sync",
		"manifest directory: sync", "… sync / 10k sync"}}
	for _, n := range slices.Sorted(maps.Keys(sizes)) {
		a, ok := api[n]
		d, ok2 := r.median(n, metricDaemonEndpoint, methodDaemon)
		t.Rows = append(t.Rows, []string{fmt.Sprint(n), cell(a[0], ok), cell(a[1], ok), ratioText(a[0], apiBase[0], ""),
			cell(d, ok2), ratioText(d, dirBase, "")})
	}
	w("### nftproxy: one endpoint replaced, by the number of services\n\n")
	w("The issue asks for at most 2 ms at 10,000 services × 3 endpoints and the same within 20%% at 30,000 and 100,000. *API server* is the peers phase (median of its runs); *manifest directory* is the daemon phase above (`nftproxy run --manifests`, median of its delta syncs), where 100,000 services load in seconds: the API server, whose Service creation costs O(services), would take over an hour to store them.\n\n")
	t.Write(b)
}

// writePeerPlots draws one bar chart per workload.
func (r *Results) writePeerPlots(dir string) error {
	p := r.Peers
	if p == nil {
		return nil
	}
	for _, wl := range p.Workloads {
		if wl.NotLoaded != "" {
			continue
		}
		c := barChart{title: fmt.Sprintf("%s: %d services, %d endpoints", wl.Name, wl.Services, wl.Endpoints), yLabel: "time", yFormat: msLabel, w: 1240}
		for _, g := range peerPlotGroups {
			c.groups = append(c.groups, g.label)
		}
		for _, proxy := range allProxies {
			s := barSeries{name: proxyTitle[proxy], color: proxyColor[proxy]}
			for _, g := range peerPlotGroups {
				// A step stopped at the limit is an open bar at the limit.
				rec, y := p.find(wl.Name, proxy, g.metric), math.NaN()
				open := rec != nil && rec.Skip == overLimit
				if open {
					y = p.LimitMS
				} else if rec != nil && rec.Skip == "" {
					y = rec.Value
				}
				s.ys, s.open = append(s.ys, y), append(s.open, open)
			}
			if slices.ContainsFunc(s.ys, func(y float64) bool { return !math.IsNaN(y) }) {
				c.bars = append(c.bars, s)
			}
		}
		if err := writeSVG(filepath.Join(dir, peerPlotFile(wl.Name)), c); err != nil {
			return err
		}
	}
	return nil
}
