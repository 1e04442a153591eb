package main

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"slices"
	"time"
)

// Proxies of the peers phase, as --proxies names them.
const (
	proxyKubeNft    = "kube-proxy-nftables"
	proxyKubeIptNft = "kube-proxy-iptables-nft"
	proxyKubeLegacy = "kube-proxy-iptables-legacy"
	proxyNftproxy   = "nftproxy"
)

var allProxies = []string{proxyKubeNft, proxyKubeIptNft, proxyKubeLegacy, proxyNftproxy}

var kubeProxies = []string{proxyKubeNft, proxyKubeIptNft, proxyKubeLegacy}

// proxyTitle is how tables and plots name a proxy.
var proxyTitle = map[string]string{
	proxyKubeNft:    "kube-proxy nftables",
	proxyKubeIptNft: "kube-proxy iptables (nft backend)",
	proxyKubeLegacy: "kube-proxy iptables-legacy",
	proxyNftproxy:   "nftproxy",
	proxyAPIWatch:   "API server to a bare watch (no proxy)",
}

// proxyColor draws each proxy in the color of its tool in the other plots.
var proxyColor = map[string]color.RGBA{
	proxyNftproxy:   methodStyle[methodNftproxy].c,
	proxyKubeNft:    methodStyle[methodNftText].c,
	proxyKubeIptNft: methodStyle[methodIptNft].c,
	proxyKubeLegacy: methodStyle[methodLegacy].c,
}

// Figures of one proxy on one workload.
const (
	peerStart       = "start"         // ms, exec to the first sync seen in /metrics
	peerFullSync    = "full-sync"     // ms, the first sync, from the proxy's histogram
	peerFullWhole   = "full-sync-all" // ms, nftproxy's first sync, both families' tables (wholeSyncMetric)
	peerEndpoint    = "endpoint-sync" // ms, the sync(s) one replaced endpoint caused
	peerEndpointWal = "endpoint-wall" // ms, API write to the new endpoint in the kernel
	peerEndpointOwn = "endpoint-own"  // ms, a bare watch's event to the new endpoint in the kernel
	peerService     = "service-sync"  // ms, the sync(s) one added service caused
	peerServiceWall = "service-wall"  // ms, API write to the new ClusterIP in the kernel
	peerServiceOwn  = "service-own"   // ms, a bare watch's event to the new ClusterIP in the kernel
	peerRSS         = "rss"           // MiB, VmRSS once the full sync settled
	peerPeak        = "peak-rss"      // MiB, VmHWM at the end
)

// overLimit is the Skip of a figure whose step was stopped at the time limit.
const overLimit = "over the time limit"

// notMeasured starts the Skip of a figure whose step came after one that
// failed or ran out of time.
const notMeasured = "not measured: "

// PeerRecord is one figure of one proxy on one workload, or why it is missing.
type PeerRecord struct {
	Workload string  `json:"workload"`
	Proxy    string  `json:"proxy"`
	Metric   string  `json:"metric"`
	Value    float64 `json:"value,omitempty"`
	Syncs    int     `json:"syncs,omitempty"` // samples the step added to the histogram
	// Samples are the runs' figures when the proxy ran several times
	// (--peer-runs); Value is then their median.
	Samples []float64 `json:"samples,omitempty"`
	Skip    string    `json:"skip,omitempty"`
}

// PeerWorkload describes a workload as it was served.
type PeerWorkload struct {
	Name      string `json:"name"`
	Title     string `json:"title"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"`
	Slices    int    `json:"slices"`
	CreateS   int    `json:"create_s"` // seconds to write it through the API
	// NotLoaded says why no proxy ran: the API server had not stored the
	// workload within --write-limit.
	NotLoaded string `json:"not_loaded,omitempty"`
}

// PeerRun is what the peers phase measured; runs of some workloads or
// proxies merge into the saved results, so the phase can run in pieces.
type PeerRun struct {
	Started   time.Time      `json:"started"`
	Duration  string         `json:"duration"`
	Quick     bool           `json:"quick"`
	LimitMS   float64        `json:"limit_ms"` // a step's time limit
	Load      []string       `json:"load,omitempty"`
	Workloads []PeerWorkload `json:"workloads"`
	Records   []PeerRecord   `json:"records"`
}

func (p *PeerRun) add(workload, proxy, metric string, v float64, syncs int) {
	p.Records = append(p.Records, PeerRecord{Workload: workload, Proxy: proxy, Metric: metric,
		Value: math.Round(v*1000) / 1000, Syncs: syncs})
}

// peerMetrics are a proxy's figures in the order its steps measure them.
var peerMetrics = []string{peerStart, peerFullSync, peerRSS, peerEndpointWal, peerEndpointOwn, peerEndpoint,
	peerServiceWall, peerServiceOwn, peerService, peerPeak}

// failed records why the figures a proxy's run did not measure are missing:
// the failed step's own (and the start, with the full sync) has its reason,
// at the limit when it ran out of time; the ones after it were not measured.
func (p *PeerRun) failed(workload, proxy string, step *errStep) {
	for _, m := range peerMetrics {
		if p.find(workload, proxy, m) != nil {
			continue
		}
		rec := PeerRecord{Workload: workload, Proxy: proxy, Metric: m, Skip: notMeasured + step.metric + " " + step.reason}
		if m == step.metric || (m == peerStart && step.metric == peerFullSync) {
			rec.Skip = step.reason
			if step.reason == overLimit {
				rec.Value = p.LimitMS
			}
		}
		p.Records = append(p.Records, rec)
	}
}

// fold makes one record of each metric of a proxy that ran several times on
// a workload: the median of the runs that measured it, with their figures,
// or the first run's reason when none did.
func (p *PeerRun) fold(workload, proxy string) {
	var metrics []string
	runs := map[string][]PeerRecord{}
	p.Records = slices.DeleteFunc(p.Records, func(r PeerRecord) bool {
		if r.Workload != workload || r.Proxy != proxy {
			return false
		}
		if runs[r.Metric] == nil {
			metrics = append(metrics, r.Metric)
		}
		runs[r.Metric] = append(runs[r.Metric], r)
		return true
	})
	for _, m := range metrics {
		measured := slices.DeleteFunc(slices.Clone(runs[m]), func(r PeerRecord) bool { return r.Skip != "" })
		if len(measured) == 0 {
			p.Records = append(p.Records, runs[m][0])
			continue
		}
		byValue := func(a, b PeerRecord) int { return cmp.Compare(a.Value, b.Value) }
		med := slices.SortedStableFunc(slices.Values(measured), byValue)[(len(measured)-1)/2]
		if len(measured) > 1 {
			for _, r := range measured {
				med.Samples = append(med.Samples, r.Value)
			}
		}
		p.Records = append(p.Records, med)
	}
}

// limitText prints the time limit as "> 5 min".
func (p *PeerRun) limitText() string {
	if m := p.LimitMS / 60000; m == math.Trunc(m) {
		return fmt.Sprintf("> %g min", m)
	}
	return "> " + fmtMS(p.LimitMS)
}

func (p *PeerRun) find(workload, proxy, metric string) *PeerRecord {
	for i := range p.Records {
		r := &p.Records[i]
		if r.Workload == workload && r.Proxy == proxy && r.Metric == metric {
			return r
		}
	}
	return nil
}

// value returns a measured figure.
func (p *PeerRun) value(workload, proxy, metric string) (float64, bool) {
	r := p.find(workload, proxy, metric)
	if r == nil || r.Skip != "" {
		return 0, false
	}
	return r.Value, true
}

func (p *PeerRun) workload(name string) *PeerWorkload {
	for i := range p.Workloads {
		if p.Workloads[i].Name == name {
			return &p.Workloads[i]
		}
	}
	return nil
}

// setWorkload adds w, or replaces the workload of its name.
func (p *PeerRun) setWorkload(w PeerWorkload) {
	if old := p.workload(w.Name); old != nil {
		*old = w
	} else {
		p.Workloads = append(p.Workloads, w)
	}
}

// mergePeers returns the new run's figures over the old ones: a (workload,
// proxy) pair measured now replaces its old figures; the rest stay.
func mergePeers(old, cur *PeerRun) *PeerRun {
	if old == nil || cur == nil {
		return cmp.Or(cur, old)
	}
	out := *cur
	measured := map[[2]string]bool{}
	for _, r := range cur.Records {
		measured[[2]string{r.Workload, r.Proxy}] = true
	}
	out.Records = append(slices.Clone(cur.Records), slices.DeleteFunc(slices.Clone(old.Records), func(r PeerRecord) bool {
		return measured[[2]string{r.Workload, r.Proxy}]
	})...)
	out.Workloads = append(slices.Clone(cur.Workloads), slices.DeleteFunc(slices.Clone(old.Workloads), func(w PeerWorkload) bool {
		return cur.workload(w.Name) != nil
	})...)
	// Keep workloads in the order of workloadSpecs, so the page does not
	// reorder with each partial run.
	order := func(name string) int {
		return slices.IndexFunc(workloadSpecs, func(s workloadSpec) bool { return s.name == name })
	}
	slices.SortStableFunc(out.Workloads, func(a, b PeerWorkload) int { return order(a.Name) - order(b.Name) })
	return &out
}

// mergeResults keeps what a partial run did not measure: the older run's
// records of other sizes, metrics and methods, its Go benchmarks when this
// run ran none, the run's facts when this run measured no phase of the
// records, and its peers and soak figures for what this run left out.
func mergeResults(old, cur *Results) *Results {
	if old == nil {
		return cur
	}
	out := *cur
	if len(cur.Records) == 0 && len(cur.GoBench) == 0 {
		out = *old
	}
	out.Records = mergeRecords(old.Records, cur.Records)
	// Every size some phase measured, so a run at other sizes keeps the
	// older rows on the page.
	out.Sizes = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(old.Sizes), cur.Sizes...))))
	if len(cur.GoBench) == 0 {
		out.GoBench = old.GoBench
	}
	out.Peers = mergePeers(old.Peers, cur.Peers)
	out.Soak = cmp.Or(cur.Soak, old.Soak) // the saved soak when this run made none
	return &out
}

// mergeRecords is cur and every old record of a size, metric and method
// cur did not measure, in old's order with cur's new ones after.
func mergeRecords(old, cur []Record) []Record {
	type key struct {
		n              int
		metric, method string
	}
	out := slices.Clone(old)
	at := map[key]int{}
	for i, r := range out {
		at[key{r.N, r.Metric, r.Method}] = i
	}
	for _, r := range cur {
		if i, ok := at[key{r.N, r.Metric, r.Method}]; ok {
			out[i] = r
		} else {
			out = append(out, r)
		}
	}
	return out
}
