package prom

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const kubeProxyPage = `# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 18.25
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.03
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 99
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1
`

const syncMetric = "kubeproxy_sync_proxy_rules_duration_seconds"

func TestHistogram(t *testing.T) {
	tests := []struct {
		name, page string
		sum        float64
		count      int
	}{
		{"kube-proxy, IPv4 series only", kubeProxyPage, 18.25, 2},
		{"no labels, a timestamp", "# TYPE " + syncMetric + " histogram\n" + syncMetric + "_bucket{le=\"0.0005\"} 0\n" +
			syncMetric + "_sum 0.1745\n" + syncMetric + "_count 1 1700000000000\n", 0.1745, 1},
		{"each sync under both families", "# TYPE " + syncMetric + " histogram\n" +
			syncMetric + "_sum{ip_family=\"IPv4\"} 0.5\n" + syncMetric + "_count{ip_family=\"IPv4\"} 2\n" +
			syncMetric + "_sum{ip_family=\"IPv6\"} 0.5\n" + syncMetric + "_count{ip_family=\"IPv6\"} 2\n", 0.5, 2},
		{"before the first sync", "# TYPE go_goroutines gauge\ngo_goroutines 12\n", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fams, err := Parse([]byte(tt.page))
			if err != nil {
				t.Fatal(err)
			}
			if h := fams.Histogram(syncMetric); h.Sum != tt.sum || h.Count != tt.count {
				t.Errorf("got %g s in %d, want %g in %d", h.Sum, h.Count, tt.sum, tt.count)
			}
		})
	}
	if _, err := Parse([]byte(syncMetric + "_sum x\n")); err == nil {
		t.Error("a bad value parsed")
	}
	if d := (Histogram{Sum: 3, Count: 5}).Sub(Histogram{Sum: 1, Count: 2}); d.Sum != 2 || d.Count != 3 {
		t.Errorf("Sub: %+v", d)
	}
}

func TestQuantile(t *testing.T) {
	fams, err := Parse([]byte(`# TYPE h histogram
h_bucket{le="0.001"} 10
h_bucket{le="0.01"} 95
h_bucket{le="0.1"} 100
h_bucket{le="+Inf"} 100
h_sum 0.3
h_count 100
`))
	if err != nil {
		t.Fatal(err)
	}
	after := fams.Histogram("h")
	before := Histogram{Buckets: []Bucket{{0.001, 10}, {0.01, 10}, {0.1, 10}, {math.Inf(1), 10}}}
	for _, tc := range []struct {
		name    string
		before  Histogram
		q, want float64
	}{
		{"all, median", Histogram{}, 0.5, 0.01},
		{"all, p99", Histogram{}, 0.99, 0.1},
		{"all, p10", Histogram{}, 0.1, 0.001},
		{"since before, p90", before, 0.9, 0.01},
		{"since before, p99", before, 0.99, 0.1},
		{"nothing observed", after, 0.99, 0},
	} {
		if got := Quantile(tc.before, after, tc.q); got != tc.want {
			t.Errorf("%s: %g, want %g", tc.name, got, tc.want)
		}
	}
}

func TestBucketsByFamily(t *testing.T) {
	fams, err := Parse([]byte(`# TYPE h histogram
h_bucket{ip_family="IPv4",le="0.001"} 10
h_bucket{ip_family="IPv4",le="+Inf"} 100
h_bucket{ip_family="IPv6",le="0.001"} 7
h_bucket{ip_family="IPv6",le="+Inf"} 70
# TYPE go_goroutines gauge
go_goroutines 17
go_threads 9
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fams.Histogram("h").Buckets, []Bucket{{0.001, 10}, {math.Inf(1), 100}}; !cmp.Equal(got, want) {
		t.Errorf("IPv4 buckets: %v, want %v", got, want)
	}
	if g, ok := fams.Gauge("go_goroutines"); !ok || g != 17 {
		t.Errorf("Gauge = %g, %v; want 17, true", g, ok)
	}
	if _, ok := fams.Gauge("go_gc_duration_seconds"); ok {
		t.Error("an absent gauge was found")
	}
}

func TestSeries(t *testing.T) {
	fams, err := Parse([]byte(kubeProxyPage))
	if err != nil {
		t.Fatal(err)
	}
	s := Series(fams[syncMetric], "ip_family", "IPv6")
	if s.GetHistogram().GetSampleCount() != 3 {
		t.Errorf("IPv6 series: %v", s)
	}
	if Series(fams[syncMetric], "ip_family", "IPv5") != nil {
		t.Error("a series of no family was found")
	}
}
