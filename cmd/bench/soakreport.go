package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// SoakRun is what `make soak` measured.
type SoakRun struct {
	Started     time.Time      `json:"started"`
	Command     string         `json:"command"`
	Source      string         `json:"source"` // soakSourceAPI or soakSourceManifests
	DurationS   float64        `json:"duration_s"`
	Services    int            `json:"services"`
	Endpoints   int            `json:"endpoints_per_service"`
	TargetRate  int            `json:"target_rate"`  // replacements a second asked for
	GraceS      float64        `json:"grace_s"`      // terminating before removal
	ConnRate    int            `json:"conn_rate"`    // connections a second asked for
	CreateRate  float64        `json:"create_rate"`  // objects a second while loading the API server
	Changes     int            `json:"changes"`      // replacements written
	Writes      int            `json:"writes"`       // slice writes (replacements and removals)
	WriteErrors int            `json:"write_errors"` // writes that failed after retries
	WriteP99MS  float64        `json:"write_p99_ms"` // queued to written
	FirstError  string         `json:"first_error,omitempty"`
	Connections int            `json:"connections"`
	Failed      int            `json:"failed"`
	FailedBy    map[string]int `json:"failed_by,omitempty"`
	Examples    []string       `json:"failure_examples,omitempty"`
	DeadHits    int            `json:"dead_hits"` // connections the pods saw to an address without a pod

	Idle    SoakPoint `json:"idle"`  // after the first sync, before the churn
	Start   SoakPoint `json:"start"` // after the warm-up of the churn
	End     SoakPoint `json:"end"`   // when the churn stopped
	PeakMiB float64   `json:"peak_mib"`

	Syncs         int     `json:"syncs"` // during the churn, from the log
	SyncP50MS     float64 `json:"sync_p50_ms"`
	SyncP99MS     float64 `json:"sync_p99_ms"`
	SyncMaxMS     float64 `json:"sync_max_ms"`
	SyncP99Bucket float64 `json:"sync_p99_bucket_ms"`        // from the histogram: the bucket's bound
	ProgP50Bucket float64 `json:"programming_p50_bucket_ms"` // network programming latency (trigger time to kernel), likewise
	ProgP99Bucket float64 `json:"programming_p99_bucket_ms"`

	Samples []SoakPoint `json:"samples,omitempty"`
	Load    []string    `json:"load,omitempty"` // before and after
}

// SoakPoint is the daemon at one moment of the soak.
type SoakPoint struct {
	AtS         float64 `json:"at_s"` // since the churn started
	RSSMiB      float64 `json:"rss_mib"`
	Goroutines  int     `json:"goroutines"`
	Syncs       int     `json:"syncs"`
	Changes     int     `json:"changes"`
	Connections int     `json:"connections"`
	Failed      int     `json:"failed"`
	Terminating int     `json:"terminating"`  // terminating endpoints in the churned state
	WriteLagMS  float64 `json:"write_lag_ms"` // mean queued-to-written of the writes since the last sample
	// LiveHeapMiB is go_memstats_heap_alloc_bytes right after a collection
	// the soak asked for (/debug/pprof/heap?gc=1): what the daemon holds,
	// without the garbage that RSS moves with. Only at idle, start and end.
	LiveHeapMiB float64 `json:"live_heap_mib,omitempty"`
}

func (p SoakPoint) String() string {
	return fmt.Sprintf("%6.0fs  RSS %6.1f MiB  goroutines %4d  syncs %5d  replacements %7d  terminating %5d  write lag %6.0f ms  connections %6d  failed %d",
		p.AtS, p.RSSMiB, p.Goroutines, p.Syncs, p.Changes, p.Terminating, p.WriteLagMS, p.Connections, p.Failed)
}

// rssMeans returns the mean RSS of the samples in the minute after the start
// and in the last minute: single readings move by several MiB with the
// collector's cycle.
func (s *SoakRun) rssMeans() (first, last float64) {
	mean := func(from, to float64) float64 {
		sum, n := 0.0, 0
		for _, pt := range s.Samples {
			if pt.AtS >= from && pt.AtS <= to {
				sum, n = sum+pt.RSSMiB, n+1
			}
		}
		return sum / float64(n) // NaN without samples
	}
	end := s.End.AtS
	return mean(s.Start.AtS, s.Start.AtS+60), mean(end-60, end)
}

func growth(from, to float64) float64 {
	if from == 0 {
		return math.NaN()
	}
	return 100 * (to - from) / from
}

// summary is the soak's figures as lines of text: what the run prints and
// what the docs quote.
func (s *SoakRun) summary() []string {
	rate := func(n int) float64 { return float64(n) / s.DurationS }
	var by []string
	for _, k := range slices.Sorted(maps.Keys(s.FailedBy)) {
		by = append(by, fmt.Sprintf("%s %d", k, s.FailedBy[k]))
	}
	first, last := s.rssMeans()
	failed := fmt.Sprintf("%d of %d", s.Failed, s.Connections)
	if len(by) > 0 {
		failed += " (" + strings.Join(by, ", ") + ")"
	}
	lines := []string{
		fmt.Sprintf("source: %s; %d services × %d endpoints; %s of churn", s.Source, s.Services, s.Endpoints, time.Duration(s.DurationS*float64(time.Second)).Round(time.Second)),
		fmt.Sprintf("endpoint replacements: %d (%.1f/s, asked %d/s); slice writes %d (%.1f/s), failed %d, queued-to-written p99 %.0f ms",
			s.Changes, rate(s.Changes), s.TargetRate, s.Writes, rate(s.Writes), s.WriteErrors, s.WriteP99MS),
		fmt.Sprintf("connections: %d (%.1f/s); failed: %s; the pods saw %d reach an address with no pod", s.Connections, rate(s.Connections), failed, s.DeadHits),
		fmt.Sprintf("nftproxy RSS: %.1f MiB idle, %.1f MiB at start (after %.0f s of churn), %.1f MiB at end: %+.1f%% (peak %.1f MiB)",
			s.Idle.RSSMiB, s.Start.RSSMiB, s.Start.AtS, s.End.RSSMiB, growth(s.Start.RSSMiB, s.End.RSSMiB), s.PeakMiB),
		fmt.Sprintf("nftproxy live heap after a collection: %.1f MiB idle, %.1f MiB at start, %.1f MiB at end: %+.1f%%; RSS mean of the samples of the first and the last minute after the start: %.1f → %.1f MiB (%+.1f%%)",
			s.Idle.LiveHeapMiB, s.Start.LiveHeapMiB, s.End.LiveHeapMiB, growth(s.Start.LiveHeapMiB, s.End.LiveHeapMiB), first, last, growth(first, last)),
		fmt.Sprintf("goroutines: %d idle, %d at start, %d at end", s.Idle.Goroutines, s.Start.Goroutines, s.End.Goroutines),
		fmt.Sprintf("syncs during the churn: %d; sync time p50 %.1f ms, p99 %.1f ms, max %.1f ms (histogram: p99 ≤ %s, network programming p50 ≤ %s, p99 ≤ %s)",
			s.Syncs, s.SyncP50MS, s.SyncP99MS, s.SyncMaxMS, bound(s.SyncP99Bucket), bound(s.ProgP50Bucket), bound(s.ProgP99Bucket)),
		fmt.Sprintf("load average: %s before, %s after", nth(s.Load, 0), nth(s.Load, 1)),
	}
	if s.CreateRate > 0 {
		lines = append(lines, fmt.Sprintf("creating the services and their slices in the API server: %.0f objects/s", s.CreateRate))
	}
	if s.FirstError != "" {
		lines = append(lines, "first write error: "+s.FirstError)
	}
	return lines
}

// grouped prints a count (never negative) with thousands separated: 10,000.
func grouped(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func bound(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return fmt.Sprintf("%.1f ms", v)
}

func nth(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "unknown"
}

// writeSoak writes the Soak section of benchmarks.md.
func (s *SoakRun) writeSoak(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## Soak\n\n")
	p("`%s` (what `make soak` runs) on %s. ", s.Command, s.Started.Format("2006-01-02 15:04 UTC"))
	p("nftproxy (`nftproxy run` with its default sync periods, and `--profiling` for the collections below) serves %s TCP ClusterIP services of %d ready endpoints each ", grouped(s.Services), s.Endpoints)
	if s.Source == soakSourceAPI {
		p("from a real kube-apiserver %s (one etcd, on 127.0.0.1, reached through a relay in nftproxy's namespace; %d writers update the EndpointSlices without reading them first). ", "v1.36.3", soakWorkers)
	} else {
		p("from a manifest directory (one file per service, replaced by a rename). ")
	}
	p("The endpoints are real: four pod namespaces on the node's bridge each hold a quarter of 10.128.0.0/16 as a local route, and one server per pod answers a connection with the address it reached and that address's service, or resets it when no pod runs at the address. ")
	p("The churn replaces one endpoint of a random service %d times a second, as a rolling update does: the new pod's address answers before the write that adds it as ready and marks an old endpoint terminating (ready false, serving true); %.0f s after that write the old pod stops answering and a second write removes its endpoint. ", s.TargetRate, s.GraceS)
	p("Clients in the client namespace connect to the ClusterIPs %d times a second throughout, half to a service changed last, half to any; a connection fails when it gets no handshake, no answer, or an answer from another service's pod. ", s.ConnRate)
	p("RSS is VmRSS, read every 10 s; *start* is after the first tenth of the churn (at most a minute), when the Go heap has grown to its working size under it; as one reading moves by several MiB with the collector's cycle, the means of a minute's readings and the live heap (`go_memstats_heap_alloc_bytes` right after a collection the soak asks for through `/debug/pprof/heap?gc=1`) at start and end are given beside it. Sync times are every sync the daemon logged during the churn (its `took`); the histogram figures are the bounds of `kubeproxy_sync_proxy_rules_duration_seconds` and `kubeproxy_network_programming_duration_seconds` buckets (the SLI: from the `endpoints.kubernetes.io/last-change-trigger-time` the soak writes on every slice, as the EndpointSlice controller does, to the rules in the kernel). Goroutines are `go_goroutines` from its /metrics.\n\n")
	p("| figure | value | goal |\n|---|---|---|\n")
	p("| failed connections | %s of %s | 0 |\n", grouped(s.Failed), grouped(s.Connections))
	p("| RSS at start → end | %.1f → %.1f MiB (%+.1f%%) | growth under 5%% |\n", s.Start.RSSMiB, s.End.RSSMiB, growth(s.Start.RSSMiB, s.End.RSSMiB))
	p("| sync time p99 (p50, max) | %.1f ms (%.1f, %.1f) over %s syncs | |\n", s.SyncP99MS, s.SyncP50MS, s.SyncMaxMS, grouped(s.Syncs))
	first, last := s.rssMeans()
	p("| RSS, mean of a minute's samples, first → last | %.1f → %.1f MiB (%+.1f%%) | |\n", first, last, growth(first, last))
	p("| live heap after a collection, start → end | %.1f → %.1f MiB (%+.1f%%) | |\n", s.Start.LiveHeapMiB, s.End.LiveHeapMiB, growth(s.Start.LiveHeapMiB, s.End.LiveHeapMiB))
	p("| goroutines at start → end | %d → %d | stable |\n", s.Start.Goroutines, s.End.Goroutines)
	p("| endpoint replacements | %s (%.1f/s) | %d/s |\n", grouped(s.Changes), float64(s.Changes)/s.DurationS, s.TargetRate)
	p("| load average (1, 5, 15 min) before / after | %s / %s | (2 cores) |\n\n", nth(s.Load, 0), nth(s.Load, 1))
	p("```\n%s\n```\n\n", strings.Join(s.summary(), "\n"))
	if len(s.Samples) > 0 {
		p("Every sample of the run:\n\n```\n")
		for _, pt := range s.Samples {
			p("%s\n", pt)
		}
		p("```\n\n")
	}
}
