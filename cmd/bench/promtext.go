package main

import (
	"fmt"
	"strconv"
	"strings"
)

// syncMetric is the histogram both proxies observe each sync into, under
// kube-proxy's name.
const syncMetric = "kubeproxy_sync_proxy_rules_duration_seconds"

// wholeSyncMetric is nftproxy's histogram of whole syncs, both families'
// tables: each family's syncMetric series counts its own table's share.
const wholeSyncMetric = "nftproxy_sync_duration_seconds"

// histogram is the _sum and _count of a histogram in Prometheus' text format.
type histogram struct {
	sum   float64 // seconds
	count int
}

// sub returns what was observed between prev and h.
func (h histogram) sub(prev histogram) histogram {
	return histogram{sum: h.sum - prev.sum, count: h.count - prev.count}
}

// parseHistogram reads the _sum and _count of the histogram name from a
// /metrics page. kube-proxy labels its series with ip_family and runs a
// proxier per family; only the IPv4 series count, as the workloads are
// IPv4. nftproxy syncs both families at once and observes each whole sync
// under both labels, so its IPv4 series is every sync; a series without
// the label (nftproxy before it had one) counts whole. A histogram vector has no series before its first
// observation, so an absent histogram reads as empty.
func parseHistogram(page, name string) (histogram, error) {
	var h histogram
	for line := range strings.Lines(page) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		// kube-proxy writes "IPv4"; compare without case.
		if l := strings.ToLower(labels); strings.Contains(l, `ip_family=`) && !strings.Contains(l, `ip_family="ipv4"`) {
			continue
		}
		// A sample may carry a timestamp after the value.
		value, _, _ = strings.Cut(strings.TrimSpace(value), " ")
		switch metric {
		case name + "_sum":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return h, fmt.Errorf("parse %s: %w", metric, err)
			}
			h.sum += v
		case name + "_count":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return h, fmt.Errorf("parse %s: %w", metric, err)
			}
			h.count += int(v)
		}
	}
	return h, nil
}

// parseProcStatus reads the kB fields of a /proc/PID/status page.
func parseProcStatus(page string) map[string]int {
	out := map[string]int{}
	for line := range strings.Lines(page) {
		k, v, ok := strings.Cut(line, ":")
		if v, unit := strings.CutSuffix(strings.TrimSpace(v), " kB"); ok && unit {
			if n, err := strconv.Atoi(v); err == nil {
				out[k] = n
			}
		}
	}
	return out
}

// parseGauge reads an unlabelled gauge (go_goroutines, say) from a /metrics
// page; ok is false when the page has none.
func parseGauge(page, name string) (v float64, ok bool) {
	for line := range strings.Lines(page) {
		value, found := strings.CutPrefix(strings.TrimSpace(line), name+" ")
		if !found {
			continue
		}
		value, _, _ = strings.Cut(strings.TrimSpace(value), " ")
		f, err := strconv.ParseFloat(value, 64)
		return f, err == nil
	}
	return 0, false
}

// bucket is one cumulative bucket of a histogram: count observations of at
// most le seconds.
type bucket struct {
	le    float64
	count float64
}

// parseBuckets reads the buckets of a histogram, in the page's order
// (Prometheus writes them by increasing le, +Inf last): the unlabelled
// series, or the IPv4 one where the histogram is split by ip_family as
// kube-proxy's are (each family's series records the whole sync).
func parseBuckets(page, name string) ([]bucket, error) {
	var out []bucket
	for line := range strings.Lines(page) {
		rest, found := strings.CutPrefix(strings.TrimSpace(line), name+`_bucket{`)
		if !found {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("parse %s_bucket: %q", name, line)
		}
		var le string
		other := false
		for _, l := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(l, "=")
			v = strings.Trim(v, `"`)
			switch {
			case k == "le":
				le = v
			case k == "ip_family" && v == "IPv4":
			default:
				other = true
			}
		}
		if other {
			continue
		}
		b := bucket{}
		var err error
		if b.le, err = strconv.ParseFloat(le, 64); err != nil {
			return nil, fmt.Errorf("parse %s_bucket le: %w", name, err)
		}
		value, _, _ = strings.Cut(strings.TrimSpace(value), " ")
		if b.count, err = strconv.ParseFloat(value, 64); err != nil {
			return nil, fmt.Errorf("parse %s_bucket: %w", name, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// bucketQuantile returns the upper bound of the bucket holding the
// q-quantile of what was observed between before and after (the same
// histogram read twice); +Inf when it lies beyond the last bound, 0 when
// nothing was observed.
func bucketQuantile(before, after []bucket, q float64) float64 {
	if len(after) == 0 {
		return 0
	}
	delta := func(i int) float64 {
		if i < len(before) {
			return after[i].count - before[i].count
		}
		return after[i].count
	}
	total := delta(len(after) - 1)
	if total == 0 {
		return 0
	}
	for i := range after {
		if delta(i) >= q*total {
			return after[i].le
		}
	}
	return after[len(after)-1].le
}
