package k8s

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// ClientMetrics are client-go's rest_client_* metrics, under the names,
// labels and buckets Kubernetes components (kube-proxy among them) serve.
type ClientMetrics struct {
	RequestLatency     *prometheus.HistogramVec
	RateLimiterLatency *prometheus.HistogramVec
	RequestSize        *prometheus.HistogramVec
	ResponseSize       *prometheus.HistogramVec
	Requests           *prometheus.CounterVec
	Retries            *prometheus.CounterVec
	TransportCache     prometheus.Gauge
	TransportCreates   *prometheus.CounterVec
}

var (
	latencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	sizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216} // 64 B .. 16 MiB
)

// NewClientMetrics makes the metrics; Collectors lists them for a registry.
func NewClientMetrics() *ClientMetrics {
	verbHost := []string{"verb", "host"}
	return &ClientMetrics{
		RequestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_duration_seconds",
			Help: "Request latency in seconds. Broken down by verb, and host.", Buckets: latencyBuckets}, verbHost),
		RateLimiterLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_rate_limiter_duration_seconds",
			Help: "Client side rate limiter latency in seconds. Broken down by verb, and host.", Buckets: latencyBuckets}, verbHost),
		RequestSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_size_bytes",
			Help: "Request size in bytes. Broken down by verb and host.", Buckets: sizeBuckets}, verbHost),
		ResponseSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_response_size_bytes",
			Help: "Response size in bytes. Broken down by verb and host.", Buckets: sizeBuckets}, verbHost),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
			Help: "Number of HTTP requests, partitioned by status code, method, and host."}, []string{"code", "method", "host"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_request_retries_total",
			Help: "Number of request retries, partitioned by status code, verb, and host."}, []string{"code", "verb", "host"}),
		TransportCache: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rest_client_transport_cache_entries",
			Help: "Number of transport entries in the internal cache."}),
		TransportCreates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_transport_create_calls_total",
			Help: "Number of calls to get a new transport, partitioned by the result of the operation hit: obtained from the cache, " +
				"miss: created and added to the cache, miss-gc: recreated and added back to the cache after being garbage collected, " +
				"uncacheable: created and not cached"}, []string{"result"}),
	}
}

// Collectors lists the metrics for a registry.
func (c *ClientMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.RequestLatency, c.RateLimiterLatency, c.RequestSize, c.ResponseSize,
		c.Requests, c.Retries, c.TransportCache, c.TransportCreates}
}

var registerClientMetrics sync.Once

// RegisterClientMetrics makes client-go report into c. client-go takes one
// set of adapters per process, the first: later calls do nothing.
func RegisterClientMetrics(c *ClientMetrics) {
	registerClientMetrics.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:        latencyAdapter{c.RequestLatency},
			RateLimiterLatency:    latencyAdapter{c.RateLimiterLatency},
			RequestSize:           sizeAdapter{c.RequestSize},
			ResponseSize:          sizeAdapter{c.ResponseSize},
			RequestResult:         resultAdapter{c.Requests},
			RequestRetry:          retryAdapter{c.Retries},
			TransportCacheEntries: gaugeAdapter{c.TransportCache},
			TransportCreateCalls:  resultCountAdapter{c.TransportCreates},
		})
	})
}

type latencyAdapter struct{ h *prometheus.HistogramVec }

func (a latencyAdapter) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	a.h.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

type sizeAdapter struct{ h *prometheus.HistogramVec }

func (a sizeAdapter) Observe(_ context.Context, verb, host string, size float64) {
	a.h.WithLabelValues(verb, host).Observe(size)
}

type resultAdapter struct{ c *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.c.WithLabelValues(code, method, host).Inc()
}

type retryAdapter struct{ c *prometheus.CounterVec }

func (a retryAdapter) IncrementRetry(_ context.Context, code, verb, host string) {
	a.c.WithLabelValues(code, verb, host).Inc()
}

type gaugeAdapter struct{ g prometheus.Gauge }

func (a gaugeAdapter) Observe(v int) { a.g.Set(float64(v)) }

type resultCountAdapter struct{ c *prometheus.CounterVec }

func (a resultCountAdapter) Increment(result string) { a.c.WithLabelValues(result).Inc() }
