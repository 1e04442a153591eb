package proxier

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are kube-proxy's sync metrics, under kube-proxy's names where they
// mean the same thing, plus nftproxy's own.
type Metrics struct {
	Registry *prometheus.Registry

	SyncDuration       prometheus.Histogram
	SyncLastTimestamp  prometheus.Gauge
	NetworkProgramming prometheus.Histogram
	EndpointChanges    prometheus.Counter
	ServiceChanges     prometheus.Counter
	FullSyncs          prometheus.Counter
	SyncFailures       prometheus.Counter
	ResyncsSkipped     prometheus.Counter
	DriftRepairs       prometheus.Counter
	BatchMessages      prometheus.Histogram
	InvalidObjects     *prometheus.CounterVec
	ConntrackDeleted   prometheus.Counter
	ConntrackDuration  prometheus.Histogram
	ConntrackFailures  prometheus.Counter
	RulesetElements    *prometheus.GaugeVec
}

// NewMetrics registers the metrics in a new registry, with the Go and
// process collectors.
func NewMetrics() *Metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16) // 0.5 ms .. 16 s
	mt := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_proxy_rules_duration_seconds", Help: "Time to compile and apply the ruleset.", Buckets: buckets}),
		SyncLastTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Help: "When the ruleset was last applied successfully."}),
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_network_programming_duration_seconds", Help: "Time from a change being seen to it being in the kernel.", Buckets: buckets}),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total", Help: "Endpoint changes seen."}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total", Help: "Service changes seen."}),
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
		ConntrackDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_conntrack_reconciler_deleted_entries_total", Help: "Stale conntrack entries deleted."}),
		ConntrackDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_conntrack_reconciler_sync_duration_seconds", Help: "Time to reconcile conntrack entries.", Buckets: buckets}),
		ConntrackFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nftproxy_conntrack_cleanup_failures_total", Help: "Conntrack cleanups that failed (retried at the next sync)."}),
		RulesetElements: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nftproxy_ruleset_elements", Help: "Set and map elements in the applied ruleset."}, []string{"family"}),
	}
	mt.Registry.MustRegister(mt.SyncDuration, mt.SyncLastTimestamp, mt.NetworkProgramming, mt.EndpointChanges,
		mt.ServiceChanges, mt.FullSyncs, mt.SyncFailures, mt.ResyncsSkipped, mt.DriftRepairs, mt.BatchMessages, mt.InvalidObjects,
		mt.ConntrackDeleted, mt.ConntrackDuration, mt.ConntrackFailures, mt.RulesetElements,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return mt
}
