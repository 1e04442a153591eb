package proxier

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// Metrics are kube-proxy's sync metrics, under kube-proxy v1.36's names,
// labels, help and buckets where they mean the same thing, plus nftproxy's
// own (nftproxy_*).
type Metrics struct {
	Registry *prometheus.Registry

	// By ip_family ("IPv4", "IPv6"), as kube-proxy, which runs one proxier
	// per family. nftproxy syncs both families at once: each family's
	// duration is its own table's share and what the sync did for both
	// (familyDuration); SyncTotal is the whole sync.
	SyncDuration        *prometheus.HistogramVec
	SyncFullDuration    *prometheus.HistogramVec
	SyncPartialDuration *prometheus.HistogramVec
	SyncLastTimestamp   *prometheus.GaugeVec
	SyncLastQueued      *prometheus.GaugeVec
	SyncTotal           prometheus.Histogram
	// NetworkProgramming is the Kubernetes SLI: from an EndpointSlice's
	// last-change-trigger-time annotation to the end of the sync that
	// programmed the change.
	NetworkProgramming *prometheus.HistogramVec
	// ChangeToKernel is nftproxy's own figure: from a change's arrival at
	// the daemon to the end of the sync that programmed it.
	ChangeToKernel   prometheus.Histogram
	NoLocalEndpoints *prometheus.GaugeVec // by traffic_policy and ip_family
	NFTablesFailures *prometheus.CounterVec

	EndpointChanges   prometheus.Counter
	ServiceChanges    prometheus.Counter
	FullSyncs         prometheus.Counter
	SyncFailures      prometheus.Counter
	ResyncsSkipped    prometheus.Counter
	DriftRepairs      prometheus.Counter
	BatchMessages     prometheus.Histogram
	InvalidObjects    *prometheus.CounterVec
	ConntrackDeleted  *prometheus.CounterVec   // by ip_family
	ConntrackDuration *prometheus.HistogramVec // by ip_family: each cleanup covers both
	ConntrackFailures prometheus.Counter
	RulesetElements   *prometheus.GaugeVec
	// HealthCheckBindFailures counts healthCheckNodePorts that could not
	// be bound (each is retried at the next update).
	HealthCheckBindFailures prometheus.Counter

	// pending reports the changes a sync has not taken yet; set by Run
	// from a source that counts them.
	pending atomic.Pointer[func() (services, endpoints uint64)]
}

// kube-proxy's buckets: sync durations 1 ms .. 16 s; network programming
// 0, then 0.25 s .. 5 min, by the second below a minute (the SLI's
// resolution; the leading 0 is component-base's MergeBuckets').
var (
	syncBuckets        = prometheus.ExponentialBuckets(0.001, 2, 15)
	programmingBuckets = mergeBuckets(
		prometheus.LinearBuckets(0.25, 0.25, 2),
		prometheus.LinearBuckets(1, 1, 59),
		prometheus.LinearBuckets(60, 5, 12),
		prometheus.LinearBuckets(120, 30, 7))
)

func mergeBuckets(parts ...[]float64) []float64 {
	out := []float64{0}
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// familyLabel is kube-proxy's ip_family value.
func familyLabel(f m.Family) string {
	if f == m.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// NewMetrics registers the metrics in a new registry, with the Go and
// process collectors.
func NewMetrics() *Metrics {
	// nftproxy's own syncs take well under kube-proxy's first bucket.
	ours := prometheus.ExponentialBuckets(0.0005, 2, 16) // 0.5 ms .. 16 s
	family := []string{"ip_family"}
	mt := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_proxy_rules_duration_seconds", Help: "SyncProxyRules latency in seconds", Buckets: syncBuckets}, family),
		SyncFullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_full_proxy_rules_duration_seconds", Help: "SyncProxyRules latency in seconds for full resyncs", Buckets: syncBuckets}, family),
		SyncPartialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_partial_proxy_rules_duration_seconds", Help: "SyncProxyRules latency in seconds for partial resyncs", Buckets: syncBuckets}, family),
		SyncLastTimestamp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Help: "The last time proxy rules were successfully synced"}, family),
		SyncLastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", Help: "The last time a sync of proxy rules was queued"}, family),
		SyncTotal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nftproxy_sync_duration_seconds", Help: "Time a sync took, both families' tables (each kubeproxy_sync_proxy_rules_duration_seconds series counts its own family's).", Buckets: ours}),
		NetworkProgramming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_network_programming_duration_seconds", Help: "In Cluster Network Programming Latency in seconds", Buckets: programmingBuckets}, family),
		ChangeToKernel: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nftproxy_network_programming_duration_seconds", Help: "Time from a change's arrival at nftproxy to the end of the sync that programmed it; periodic resyncs don't count.", Buckets: ours}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total", Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy", "ip_family"}),
		NFTablesFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", Help: "Cumulative proxy nftables sync failures"}, family),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total", Help: "Cumulative proxy rules Endpoint changes"}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total", Help: "Cumulative proxy rules Service changes"}),
		FullSyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_sync_full_total", Help: "Syncs that replaced the whole table."}),
		SyncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_sync_failures_total", Help: "Syncs whose netlink batch failed."}),
		ResyncsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_resync_skipped_total", Help: "Periodic full syncs skipped because no nftables commit happened since the last sync."}),
		DriftRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_drift_repairs_total", Help: "Full syncs started because another program changed nftproxy's tables."}),
		BatchMessages: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nftproxy_batch_messages", Help: "Netlink messages per applied batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 12)}),
		InvalidObjects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nftproxy_invalid_objects_total", Help: "Services and EndpointSlices (or parts of them) skipped as invalid."}, []string{"kind"}),
		ConntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_conntrack_reconciler_deleted_entries_total", Help: "Cumulative conntrack flows deleted by conntrack reconciler"}, family),
		ConntrackDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeproxy_conntrack_reconciler_sync_duration_seconds", Help: "ReconcileConntrackFlowsLatency latency in seconds", Buckets: syncBuckets}, family),
		ConntrackFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_conntrack_cleanup_failures_total", Help: "Conntrack cleanups that failed (retried at the next sync)."}),
		RulesetElements: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nftproxy_ruleset_elements", Help: "Set and map elements in the applied ruleset."}, []string{"family"}),
		HealthCheckBindFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_healthcheck_bind_failures_total", Help: "Attempts to serve a healthCheckNodePort that failed to bind (retried at the next update)."}),
	}
	pendingGauge := func(name, help string, endpoints bool) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			f := mt.pending.Load()
			if f == nil {
				return 0
			}
			s, e := (*f)()
			if endpoints {
				return float64(e)
			}
			return float64(s)
		})
	}
	mt.Registry.MustRegister(mt.SyncDuration, mt.SyncFullDuration, mt.SyncPartialDuration, mt.SyncLastTimestamp,
		mt.SyncLastQueued, mt.SyncTotal, mt.NetworkProgramming, mt.ChangeToKernel, mt.NoLocalEndpoints, mt.NFTablesFailures,
		pendingGauge("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes", true),
		pendingGauge("kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes", false),
		mt.EndpointChanges, mt.ServiceChanges, mt.FullSyncs, mt.SyncFailures, mt.ResyncsSkipped, mt.DriftRepairs,
		mt.BatchMessages, mt.InvalidObjects, mt.ConntrackDeleted, mt.ConntrackDuration, mt.ConntrackFailures, mt.RulesetElements,
		mt.HealthCheckBindFailures, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return mt
}

// initFamilies makes the series of each family exist from the start, as
// kube-proxy's proxiers do once they run: a dashboard finds them before the
// first change or failure.
func (mt *Metrics) initFamilies(families []m.Family) {
	for _, f := range families {
		l := familyLabel(f)
		mt.NFTablesFailures.WithLabelValues(l)
		mt.NoLocalEndpoints.WithLabelValues("internal", l)
		mt.NoLocalEndpoints.WithLabelValues("external", l)
		mt.ConntrackDeleted.WithLabelValues(l)
		mt.ConntrackDuration.WithLabelValues(l)
	}
}

// watchPending makes the *_changes_pending gauges read the source's counts.
func (mt *Metrics) watchPending(f func() (services, endpoints uint64)) {
	mt.pending.Store(&f)
}
