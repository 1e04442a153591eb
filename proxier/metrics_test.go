package proxier

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

var testConfig6 = Config{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}}

// gather returns the registry's families by name.
func gather(t *testing.T, mt *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := mt.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// labelNames lists a series' label names, sorted.
func labelNames(s *dto.Metric) []string {
	var out []string
	for _, l := range s.GetLabel() {
		out = append(out, l.GetName())
	}
	slices.Sort(out)
	return out
}

// TestMetricsAsKubeProxy: after a dual-stack sync, every kube-proxy v1.36
// metric nftproxy serves has kube-proxy's type, help, label names and
// buckets (copied here from pkg/proxy/metrics by hand, as the reference).
func TestMetricsAsKubeProxy(t *testing.T) {
	mt := NewMetrics()
	p := New(Options{Configs: []Config{testConfig, testConfig6}, Kernel: &recordingKernel{}, Metrics: mt})
	if err := p.Sync(context.Background(), &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)}}, true); err != nil {
		t.Fatal(err)
	}
	p.queued()
	p.observeProgramming([]k8s.TriggerTime{{Time: time.Now()}}, time.Now())
	mt.ConntrackDuration.WithLabelValues("IPv4").Observe(0.01)
	syncBuckets := []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}
	var programming []float64
	programming = append(programming, 0, 0.25, 0.5)
	for s := 1; s <= 59; s++ {
		programming = append(programming, float64(s))
	}
	for s := 60; s <= 115; s += 5 {
		programming = append(programming, float64(s))
	}
	for s := 120; s <= 300; s += 30 {
		programming = append(programming, float64(s))
	}
	family := []string{"ip_family"}
	want := []struct {
		name, help string
		typ        dto.MetricType
		labels     []string
		buckets    []float64
	}{
		{"kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", dto.MetricType_HISTOGRAM, family, syncBuckets},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", dto.MetricType_HISTOGRAM, family, syncBuckets},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced", dto.MetricType_GAUGE, family, nil},
		{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued", dto.MetricType_GAUGE, family, nil},
		{"kubeproxy_network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", dto.MetricType_HISTOGRAM, family, programming},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes", dto.MetricType_GAUGE, nil, nil},
		{"kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes", dto.MetricType_GAUGE, nil, nil},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes", dto.MetricType_COUNTER, nil, nil},
		{"kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes", dto.MetricType_COUNTER, nil, nil},
		// A gauge despite its name, as in kube-proxy.
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints", dto.MetricType_GAUGE, []string{"ip_family", "traffic_policy"}, nil},
		{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", dto.MetricType_COUNTER, family, nil},
		{"kubeproxy_conntrack_reconciler_sync_duration_seconds", "ReconcileConntrackFlowsLatency latency in seconds", dto.MetricType_HISTOGRAM, family, syncBuckets},
		{"kubeproxy_conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler", dto.MetricType_COUNTER, family, nil},
		{"nftproxy_network_programming_duration_seconds", "", dto.MetricType_HISTOGRAM, nil, nil},
		{"nftproxy_sync_duration_seconds", "", dto.MetricType_HISTOGRAM, nil, nil},
	}
	fams := gather(t, mt)
	for _, w := range want {
		f := fams[w.name]
		if f == nil {
			t.Errorf("%s: not served", w.name)
			continue
		}
		if w.help != "" && f.GetHelp() != w.help {
			t.Errorf("%s: help %q, want kube-proxy's %q", w.name, f.GetHelp(), w.help)
		}
		if f.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", w.name, f.GetType(), w.typ)
		}
		for _, s := range f.GetMetric() {
			if got := labelNames(s); !slices.Equal(got, w.labels) {
				t.Errorf("%s: labels %v, want %v", w.name, got, w.labels)
			}
			if w.buckets == nil {
				continue
			}
			var got []float64
			for _, b := range s.GetHistogram().GetBucket() {
				got = append(got, b.GetUpperBound())
			}
			if !slices.EqualFunc(got, w.buckets, func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }) {
				t.Errorf("%s: buckets %v, want %v", w.name, got, w.buckets)
			}
		}
		// The per-family metrics have a series for each family synced.
		if slices.Equal(w.labels, family) && w.name != "kubeproxy_network_programming_duration_seconds" && len(f.GetMetric()) != 2 {
			t.Errorf("%s: %d series, want one per family", w.name, len(f.GetMetric()))
		}
	}
}

// TestSyncMetricsByFamilyAndKind: a full sync counts under the full
// histogram of each family, a delta under the partial one; a failed batch
// counts as an nftables sync failure of its family and moves no
// timestamp.
func TestSyncMetricsByFamilyAndKind(t *testing.T) {
	mt := NewMetrics()
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig, testConfig6}, Kernel: k, Metrics: mt})
	ctx := context.Background()
	one := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	two := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 3)}}
	histCount := func(name, family string) uint64 {
		t.Helper()
		for _, s := range gather(t, mt)[name].GetMetric() {
			if s.GetLabel()[0].GetValue() == family {
				return s.GetHistogram().GetSampleCount()
			}
		}
		return 0
	}
	type counts struct{ full4, partial4, full6, partial6, failed4, failed6 uint64 }
	got := func() counts {
		return counts{
			histCount("kubeproxy_sync_full_proxy_rules_duration_seconds", "IPv4"),
			histCount("kubeproxy_sync_partial_proxy_rules_duration_seconds", "IPv4"),
			histCount("kubeproxy_sync_full_proxy_rules_duration_seconds", "IPv6"),
			histCount("kubeproxy_sync_partial_proxy_rules_duration_seconds", "IPv6"),
			uint64(testutil.ToFloat64(mt.NFTablesFailures.WithLabelValues("IPv4"))),
			uint64(testutil.ToFloat64(mt.NFTablesFailures.WithLabelValues("IPv6"))),
		}
	}
	steps := []struct {
		name string
		snap *k8s.Snapshot
		fail string // family whose batch fails
		want counts
	}{
		{"first sync is full", one, "", counts{full4: 1, full6: 1}},
		{"endpoint change is partial", two, "", counts{full4: 1, full6: 1, partial4: 1, partial6: 1}},
		{"IPv4 batch fails", one, "ip", counts{full4: 1, full6: 1, partial4: 1, partial6: 1, failed4: 1}},
		{"then full again", one, "", counts{full4: 2, full6: 2, partial4: 1, partial6: 1, failed4: 1}},
	}
	for _, st := range steps {
		k.fail, k.failFamily = nil, st.fail
		if st.fail != "" {
			k.fail = errors.New("EBUSY")
		}
		before := testutil.ToFloat64(mt.SyncLastTimestamp.WithLabelValues("IPv4"))
		err := p.Sync(ctx, st.snap, false)
		if (err != nil) != (st.fail != "") {
			t.Fatalf("%s: %v", st.name, err)
		}
		if c := got(); c != st.want {
			t.Errorf("%s: %+v, want %+v", st.name, c, st.want)
		}
		after := testutil.ToFloat64(mt.SyncLastTimestamp.WithLabelValues("IPv4"))
		if moved := after != before; moved == (st.fail != "") {
			t.Errorf("%s: last timestamp %v -> %v", st.name, before, after)
		}
	}
}

// TestNoLocalEndpoints: the gauge counts, by traffic policy and family,
// the service ports whose Local policy finds no local endpoint while the
// service has endpoints, as kube-proxy counts them; delta syncs keep the
// counts right.
func TestNoLocalEndpoints(t *testing.T) {
	node := k8s.Node{Name: "node-1"}
	local := func(sp *k8s.ServicePort) { sp.Endpoints[0].NodeName = "node-1" }
	itp := func(sp *k8s.ServicePort) { sp.InternalPolicyLocal = true }
	etp := func(sp *k8s.ServicePort) { sp.ExternalPolicyLocal = true; sp.NodePort = 30080 }
	dual := func(sp *k8s.ServicePort) {
		sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00::1"))
		sp.Endpoints = append(sp.Endpoints, k8s.Endpoint{Addr: netip.MustParseAddr("fd00:244::1"), Port: 8080, Ready: true, Serving: true, NodeName: "node-1"})
	}
	type counts struct{ internal4, external4, internal6, external6 float64 }
	steps := []struct {
		name     string
		services []k8s.ServicePort
		want     counts
	}{
		{"none local", []k8s.ServicePort{
			svc("a", "http", "10.96.0.1", 2, itp),
			svc("b", "http", "10.96.0.2", 2, etp),
			svc("c", "http", "10.96.0.3", 2, itp, etp),
			svc("no-endpoints", "http", "10.96.0.4", 0, itp, etp), // rejected, not counted
			svc("cluster", "http", "10.96.0.5", 2),
			svc("d", "http", "10.96.0.6", 1, itp, etp, dual), // its IPv6 endpoint is local
		}, counts{internal4: 3, external4: 3}},
		{"one becomes local", []k8s.ServicePort{
			svc("a", "http", "10.96.0.1", 2, itp, local),
			svc("b", "http", "10.96.0.2", 2, etp),
			svc("c", "http", "10.96.0.3", 2, itp, etp),
			svc("no-endpoints", "http", "10.96.0.4", 0, itp, etp),
			svc("cluster", "http", "10.96.0.5", 2),
			svc("d", "http", "10.96.0.6", 1, itp, etp, dual),
		}, counts{internal4: 2, external4: 3}},
		{"one goes", []k8s.ServicePort{
			svc("a", "http", "10.96.0.1", 2, itp, local),
			svc("b", "http", "10.96.0.2", 2, etp),
			svc("no-endpoints", "http", "10.96.0.4", 0, itp, etp),
			svc("cluster", "http", "10.96.0.5", 2),
			svc("d", "http", "10.96.0.6", 1, itp, etp, dual),
		}, counts{internal4: 1, external4: 2}},
		{"its IPv6 endpoint is not local any more", []k8s.ServicePort{
			svc("a", "http", "10.96.0.1", 2, itp, local),
			svc("b", "http", "10.96.0.2", 2, etp),
			svc("no-endpoints", "http", "10.96.0.4", 0, itp, etp),
			svc("cluster", "http", "10.96.0.5", 2),
			svc("d", "http", "10.96.0.6", 1, itp, etp, dual, func(sp *k8s.ServicePort) { sp.Endpoints[1].NodeName = "node-2" }),
		}, counts{internal4: 1, external4: 2, internal6: 1, external6: 1}},
	}
	mt := NewMetrics()
	k := &recordingKernel{}
	p := New(Options{Configs: []Config{testConfig, testConfig6}, Kernel: k, Metrics: mt})
	gauge := func(policy, family string) float64 {
		return testutil.ToFloat64(mt.NoLocalEndpoints.WithLabelValues(policy, family))
	}
	for i, st := range steps {
		k.calls = nil
		if err := p.Sync(context.Background(), &k8s.Snapshot{Node: node, Services: st.services}, false); err != nil {
			t.Fatal(err)
		}
		if i > 0 && (slices.Contains(k.calls, "full ip") || slices.Contains(k.calls, "full ip6")) {
			t.Errorf("%s: kernel calls %v, want deltas", st.name, k.calls)
		}
		got := counts{gauge("internal", "IPv4"), gauge("external", "IPv4"), gauge("internal", "IPv6"), gauge("external", "IPv6")}
		if got != st.want {
			t.Errorf("%s: %+v, want %+v", st.name, got, st.want)
		}
	}
}

// changingSource hands over one change with trigger times and counts
// changes pending until it is taken.
type changingSource struct {
	staticSource
	mu       sync.Mutex
	triggers []k8s.TriggerTime
	taken    bool
}

func (s *changingSource) TakeChanges() k8s.Changes {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.staticSource.TakeChanges()
	ch.TriggerTimes, s.triggers = s.triggers, nil
	s.taken = true
	return ch
}

func (s *changingSource) Pending() (services, endpoints uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken {
		return 0, 0
	}
	return 1, 3
}

// TestRunObservesNetworkProgramming: Run observes kube-proxy's network
// programming latency from the trigger times the source hands over, in
// the family of each, once the sync that took them succeeded; nftproxy's
// own figure runs from the change's arrival. The pending gauges read the
// source, the last-queued timestamp moves when a sync is queued.
func TestRunObservesNetworkProgramming(t *testing.T) {
	mt := NewMetrics()
	k := &lockedKernel{}
	k.k.fail, k.k.failFamily = errors.New("EBUSY"), "ip"
	src := &changingSource{staticSource: staticSource{&k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}},
		triggers: []k8s.TriggerTime{{Time: time.Now().Add(-30 * time.Second)}, {Time: time.Now().Add(-10 * time.Second), IPv6: true}}}
	fams := gather(t, mt)
	for _, name := range []string{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", "kubeproxy_sync_proxy_rules_service_changes_pending"} {
		if v := fams[name].GetMetric()[0].GetGauge().GetValue(); v != 0 {
			t.Errorf("%s = %v before Run, want 0", name, v)
		}
	}
	p := New(Options{Configs: []Config{testConfig, testConfig6}, Kernel: k, Metrics: mt, SyncPeriod: time.Hour})
	// Before Run takes anything: the source's counts.
	p.opts.Metrics.watchPending(src.Pending)
	fams = gather(t, mt)
	if e, s := fams["kubeproxy_sync_proxy_rules_endpoint_changes_pending"].GetMetric()[0].GetGauge().GetValue(),
		fams["kubeproxy_sync_proxy_rules_service_changes_pending"].GetMetric()[0].GetGauge().GetValue(); e != 3 || s != 1 {
		t.Errorf("pending endpoint, service changes = %v, %v, want the source's 3, 1", e, s)
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx, src); close(done) }()
	defer func() { cancel(); <-done }()
	// The first sync fails in IPv4 and its retry, a second later, succeeds:
	// the times taken by the failed sync count then.
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(mt.SyncLastTimestamp.WithLabelValues("IPv4")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no successful sync")
		}
		k.mu.Lock()
		if len(k.k.calls) > 0 {
			k.k.fail = nil
		}
		k.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	fams = gather(t, mt)
	byFamily := map[string]*dto.Histogram{}
	for _, s := range fams["kubeproxy_network_programming_duration_seconds"].GetMetric() {
		byFamily[s.GetLabel()[0].GetValue()] = s.GetHistogram()
	}
	for family, age := range map[string]float64{"IPv4": 30, "IPv6": 10} {
		h := byFamily[family]
		if h.GetSampleCount() != 1 || h.GetSampleSum() < age || h.GetSampleSum() > age+time.Since(start).Seconds()+1 {
			t.Errorf("network programming %s: %d observations summing to %v, want one of %v s", family, h.GetSampleCount(), h.GetSampleSum(), age)
		}
	}
	own := fams["nftproxy_network_programming_duration_seconds"].GetMetric()[0].GetHistogram()
	if own.GetSampleCount() != 1 || own.GetSampleSum() < 0.9 || own.GetSampleSum() > time.Since(start).Seconds() {
		t.Errorf("nftproxy_network_programming_duration_seconds: %d observations summing to %v, want one over the retry's second",
			own.GetSampleCount(), own.GetSampleSum())
	}
	if e := fams["kubeproxy_sync_proxy_rules_endpoint_changes_pending"].GetMetric()[0].GetGauge().GetValue(); e != 0 {
		t.Errorf("pending endpoint changes = %v after the sync, want 0", e)
	}
	for _, s := range fams["kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"].GetMetric() {
		if v := s.GetGauge().GetValue(); v < float64(start.Unix()) {
			t.Errorf("last queued %v = %v, want at least the start %v", s.GetLabel(), v, start.Unix())
		}
	}
}

// TestBuildLabels: kubernetes_build_info's labels from the version given at
// build time and the VCS stamp.
func TestBuildLabels(t *testing.T) {
	stamp := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"},
		{Key: "vcs.modified", Value: "false"}, {Key: "vcs.time", Value: "2026-11-25T07:00:00Z"}}}
	tests := []struct {
		version, commit string
		bi              *debug.BuildInfo
		want            map[string]string // the labels that depend on the inputs
	}{
		{"v1.2.3", "deadbeef", stamp, map[string]string{"major": "1", "minor": "2", "git_version": "v1.2.3",
			"git_commit": "deadbeef", "git_tree_state": "clean", "build_date": "2026-11-25T07:00:00Z"}},
		{"dev", "unknown", stamp, map[string]string{"major": "", "minor": "", "git_version": "dev",
			"git_commit": "abc123", "git_tree_state": "clean", "build_date": "2026-11-25T07:00:00Z"}},
		{"dev", "unknown", nil, map[string]string{"major": "", "minor": "", "git_version": "dev",
			"git_commit": "unknown", "git_tree_state": "", "build_date": ""}},
	}
	for _, tt := range tests {
		got := buildLabels(tt.version, tt.commit, tt.bi)
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%s %s: %s = %q, want %q", tt.version, tt.commit, k, got[k], v)
			}
		}
		if got["go_version"] != runtime.Version() || got["platform"] != runtime.GOOS+"/"+runtime.GOARCH || len(got) != 9 {
			t.Errorf("%s: labels %v, want Kubernetes' nine", tt.version, got)
		}
	}
	if n := testutil.CollectAndCount(BuildInfo("v1.2.3", "x"), "kubernetes_build_info"); n != 1 {
		t.Errorf("kubernetes_build_info: %d series, want 1", n)
	}
}

// countingKernel is a recordingKernel whose forward rule has counted
// packets: more with every read, from zero after each full apply.
type countingKernel struct {
	recordingKernel
	counted map[m.Family]uint64
}

func (k *countingKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	st, err := k.recordingKernel.Apply(rs)
	if err == nil {
		k.counted[rs.Family] = 0
	}
	return st, err
}

func (k *countingKernel) CounterPackets(f m.Family, table, chain string) (uint64, error) {
	if table != TableName || chain != chainFilterForward {
		return 0, errors.New("not the invalid-drop rule")
	}
	return k.counted[f], nil
}

// TestInvalidDropsCounted: the counter of packets dropped as invalid is the
// kernel rule's, plus what the rules replaced by full syncs had counted;
// a failed full apply, which leaves the rule in place, adds nothing.
func TestInvalidDropsCounted(t *testing.T) {
	k := &countingKernel{counted: map[m.Family]uint64{}}
	mt := NewMetrics()
	noDrop := testConfig6
	noDrop.DropInvalid = false
	p := New(Options{Configs: []Config{testConfig, noDrop}, Kernel: k, Metrics: mt})
	snap := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 1)}}
	value := func() float64 {
		t.Helper()
		f := gather(t, mt)["nftproxy_ct_state_invalid_dropped_packets_total"]
		if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetLabel()[0].GetValue() != "IPv4" {
			t.Fatalf("nftproxy_ct_state_invalid_dropped_packets_total: %v, want one IPv4 series", f)
		}
		return f.GetMetric()[0].GetCounter().GetValue()
	}
	steps := []struct {
		name    string
		drops   uint64 // counted by the rule before the step
		full    bool
		fail    bool
		want    float64
		counted uint64 // the rule's count after the step
	}{
		{"first sync", 0, true, false, 0, 0},
		{"drops", 5, false, false, 5, 5},
		{"full sync replaces the rule", 2, true, false, 7, 0},
		{"more drops", 3, false, false, 10, 3},
		{"failed full sync keeps the rule", 1, true, true, 11, 4},
		{"then a full sync", 0, true, false, 11, 0},
	}
	for _, st := range steps {
		k.counted[m.IPv4] += st.drops
		k.fail, k.failFamily = nil, ""
		if st.fail {
			k.fail, k.failFamily = errors.New("EBUSY"), "ip"
		}
		if err := p.Sync(context.Background(), snap, st.full); (err != nil) != st.fail {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := value(); got != st.want || k.counted[m.IPv4] != st.counted {
			t.Errorf("%s: %v (rule %d), want %v (rule %d)", st.name, got, k.counted[m.IPv4], st.want, st.counted)
		}
	}
}

func TestFamilyDuration(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, c := range []struct {
		name    string
		elapsed time.Duration
		own     []time.Duration
		want    []time.Duration
	}{
		{"one family takes the whole sync", ms(10), []time.Duration{ms(8)}, []time.Duration{ms(10)}},
		{"each family its own share and the shared rest", ms(10), []time.Duration{ms(6), ms(1)}, []time.Duration{ms(9), ms(4)}},
		{"no shared rest", ms(7), []time.Duration{ms(6), ms(1)}, []time.Duration{ms(6), ms(1)}},
		// Clocks read apart may sum past elapsed by a tick.
		{"shared never negative", ms(7), []time.Duration{ms(6), ms(2)}, []time.Duration{ms(6), ms(2)}},
	} {
		for i, want := range c.want {
			if got := familyDuration(c.elapsed, c.own, i); got != want {
				t.Errorf("%s: family %d: %v, want %v", c.name, i, got, want)
			}
		}
	}
}

// slowKernel takes delay over each batch of one family.
type slowKernel struct {
	recordingKernel
	family m.Family
	delay  time.Duration
}

func (k *slowKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	if rs.Family == k.family {
		time.Sleep(k.delay)
	}
	return k.recordingKernel.Apply(rs)
}

// TestSyncDurationByFamily: a family's series counts its own table, not
// the other family's (kube-proxy times each family's proxier alone), and
// nftproxy_sync_duration_seconds counts the whole sync.
func TestSyncDurationByFamily(t *testing.T) {
	mt := NewMetrics()
	const delay = 200 * time.Millisecond
	k := &slowKernel{family: m.IPv6, delay: delay}
	p := New(Options{Configs: []Config{testConfig, testConfig6}, Kernel: k, Metrics: mt})
	snap := &k8s.Snapshot{Services: []k8s.ServicePort{svc("web", "http", "10.96.0.10", 2)}}
	if err := p.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
	sum := func(h prometheus.Observer) float64 {
		var d dto.Metric
		if err := h.(prometheus.Metric).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetHistogram().GetSampleSum()
	}
	v4, v6 := sum(mt.SyncDuration.WithLabelValues("IPv4")), sum(mt.SyncDuration.WithLabelValues("IPv6"))
	total := sum(mt.SyncTotal)
	if v6 < delay.Seconds() || total < v6 {
		t.Errorf("IPv6 %.3fs, whole sync %.3fs: want both at least the IPv6 batch's %v, the whole at least IPv6's", v6, total, delay)
	}
	if v4 > v6-0.75*delay.Seconds() {
		t.Errorf("IPv4 %.3fs: counts the IPv6 batch (IPv6 %.3fs)", v4, v6)
	}
	if full4 := sum(mt.SyncFullDuration.WithLabelValues("IPv4")); full4 != v4 {
		t.Errorf("full IPv4 %.3fs, want the sync's %.3fs", full4, v4)
	}
}
