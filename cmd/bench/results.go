package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Metrics: what was measured. Each record is one (size, metric, method).
const (
	metricFullSync       = "full-sync"       // ms, fresh namespace
	metricFullSyncRSS    = "full-sync-rss"   // MiB, peak RSS of the syncing process
	metricFullSyncCPU    = "full-sync-cpu"   // ms, user+system CPU of the syncing process
	metricEndpointChange = "endpoint-change" // ms, one endpoint of one service replaced
	metricServiceAdded   = "service-added"   // ms, one service with three endpoints added
	metricConnect        = "connect"         // ms, TCP connect + first byte from the client namespace
	metricLiveHeap       = "live-heap"       // MiB after a collection, per stage of a full sync
	metricDaemonRSS      = "daemon-rss"      // MiB, nftproxy run after its first sync and at steady state
	metricDaemonHeap     = "daemon-heap"     // MiB, go_memstats_heap_alloc_bytes at steady state
	metricDaemonPeak     = "daemon-peak"     // MiB, nftproxy run's peak RSS (VmHWM)
	metricDaemonRelease  = "daemon-release"  // ms, debug.FreeOSMemory after the first sync
	metricDaemonStart    = "daemon-start"    // ms, nftproxy run from exec to its first sync done
	metricDaemonFullSync = "daemon-full"     // ms, nftproxy run's first sync, as it logs it
	metricDaemonEndpoint = "daemon-endpoint" // ms, nftproxy run's sync of one endpoint replaced in a manifest, median
)

// Methods: who did the work.
const (
	methodNftproxy        = "nftproxy"                         // full: compile + one netlink batch; update: proxier.SyncChanges
	methodCompile         = "nftproxy compile"                 // full: Sync's share before the batch; update: its user-space share
	methodApply           = "nftproxy netlink"                 // nftnl.Apply / ApplyChanges alone
	methodMemLimit        = "nftproxy, GOMEMLIMIT=" + memLimit // the same child with a soft memory limit
	methodFullDiff        = "full compile + diff"              // the replaced update path: Compile + Diff + ApplyChanges
	methodNftText         = "nft -f"                           // the same ruleset or change as nft text
	methodLegacy          = "iptables-legacy-restore"          // kube-proxy's full-table restore
	methodLegacyPartial   = "iptables-legacy --noflush"        // kube-proxy's partial restore
	methodIptNft          = "iptables-nft-restore"             // kube-proxy's full-table restore, nf_tables backend
	methodIptNftPartial   = "iptables-nft --noflush"           // kube-proxy's partial restore, nf_tables backend
	methodDaemon          = "nftproxy run"                     // at steady state
	methodDaemonFirst     = "nftproxy run, first sync"         // right after the first sync
	methodDaemonLoaded    = "nftproxy run, manifests loaded"   // peak: decoding, before the first sync
	methodMemFloor        = "nftproxy, GOMEMLIMIT=1MiB"        // collecting all the time: the live peak
	methodConnNftFirst    = "nftproxy, first service"
	methodConnNftLast     = "nftproxy, last service"
	methodConnLegacyFirst = "iptables, first service"
	methodConnLegacyLast  = "iptables, last service"
)

// Record is one measurement: a value per run (or per sample), or the reason
// it was skipped.
type Record struct {
	N      int       `json:"n"`
	Metric string    `json:"metric"`
	Method string    `json:"method"`
	Values []float64 `json:"values,omitempty"`
	Skip   string    `json:"skip,omitempty"`
}

// Results is everything one run of the program measured.
type Results struct {
	Started  time.Time `json:"started"`
	Duration string    `json:"duration"`
	Quick    bool      `json:"quick"`
	Runs     int       `json:"runs"`
	Sizes    []int     `json:"sizes"`
	Machine  Machine   `json:"machine"`
	Records  []Record  `json:"records,omitempty"`
	GoBench  []GoBench `json:"go_bench,omitempty"`
	Load     []string  `json:"load,omitempty"`  // /proc/loadavg before and after
	Peers    *PeerRun  `json:"peers,omitempty"` // the peers phase: nftproxy against kube-proxy
	Soak     *SoakRun  `json:"soak,omitempty"`  // the soak phase
}

// add records values, rounded to a thousandth of their unit (a microsecond,
// a KiB): finer digits are noise and would only bloat the results file.
func (r *Results) add(n int, metric, method string, values ...float64) {
	rounded := make([]float64, len(values))
	for i, v := range values {
		rounded[i] = math.Round(v*1000) / 1000
	}
	r.Records = append(r.Records, Record{N: n, Metric: metric, Method: method, Values: rounded})
}

// whole runs measure on a scratch list of records and keeps them only when it
// succeeds: a run that fails part way must not leave some of its figures
// beside the others of an earlier run, which the merge with the saved
// results would then mix.
func (r *Results) whole(measure func(*Results) error) error {
	scratch := &Results{}
	if err := measure(scratch); err != nil {
		return err
	}
	r.Records = append(r.Records, scratch.Records...)
	return nil
}

func (r *Results) skip(n int, metric, method, why string) {
	r.Records = append(r.Records, Record{N: n, Metric: metric, Method: method, Skip: why})
}

// find returns the record of (n, metric, method), nil when there is none.
func (r *Results) find(n int, metric, method string) *Record {
	for i := range r.Records {
		rec := &r.Records[i]
		if rec.N == n && rec.Metric == metric && rec.Method == method {
			return rec
		}
	}
	return nil
}

// largest is the largest size with a measured record of metric and
// method; the largest size when none has one.
func (r *Results) largest(metric, method string) int {
	for i := len(r.Sizes) - 1; i >= 0; i-- {
		if rec := r.find(r.Sizes[i], metric, method); rec != nil && rec.Skip == "" {
			return r.Sizes[i]
		}
	}
	return r.Sizes[len(r.Sizes)-1]
}

// measuredSizes are the sizes with a measured record of metric and method.
func (r *Results) measuredSizes(metric, method string) []int {
	var out []int
	for _, rec := range r.Records {
		if rec.Metric == metric && rec.Method == method && !slices.Contains(out, rec.N) {
			out = append(out, rec.N)
		}
	}
	slices.Sort(out)
	return out
}

func (r *Results) save(path string) error {
	// One record per line: readable, and thousands of samples stay short.
	var b bytes.Buffer
	head := *r
	head.Records = nil
	data, err := json.MarshalIndent(head, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	b.Write(bytes.TrimSuffix(data, []byte("\n}")))
	b.WriteString(",\n  \"records\": [")
	for i, rec := range r.Records {
		line, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n    ")
		b.Write(line)
	}
	b.WriteString("\n  ]\n}")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("make results directory: %w", err)
	}
	if err := os.WriteFile(path, append(b.Bytes(), '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func loadResults(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode results %s: %w", path, err)
	}
	return &r, nil
}

// quantile returns the q-quantile of values by linear interpolation between
// the closest ranks.
func quantile(values []float64, q float64) float64 {
	s := slices.Sorted(slices.Values(values))
	if len(s) == 0 {
		return 0
	}
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[lo] + (pos-float64(lo))*(s[lo+1]-s[lo])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
