package proxier

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/k8s"
)

// Health tracks whether syncs keep up with changes and whether load
// balancers should send to this node, like kube-proxy's healthz server
// (KEP-3836): /livez fails when a change has waited longer than Timeout
// without a successful sync; /healthz fails then too, and also while the
// node is not eligible (its Node object is being deleted or carries
// k8s.TaintToBeDeleted, or it has none and RequireNode is set).
type Health struct {
	Timeout time.Duration
	// RequireNode makes a node without a Node object ineligible, as in
	// kube-proxy, which always reads it from the API server. Off for the
	// manifest source, where a Node is optional.
	RequireNode bool
	now         func() time.Time

	healthz, livez *prometheus.CounterVec

	mu          sync.Mutex
	families    []string  // kube-proxy's IP family names, for the body's status
	lastQueued  time.Time // oldest change not yet applied; zero when none
	lastUpdated time.Time
	node        k8s.Node
	nodeKnown   bool // SetNode was called
}

// NewHealth returns a Health with the given staleness timeout.
func NewHealth(timeout time.Duration) *Health {
	return &Health{Timeout: timeout, now: time.Now,
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_healthz_total", Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_livez_total", Help: "Cumulative proxy livez HTTP status"}, []string{"code"}),
	}
}

// Collectors are the counters of /healthz and /livez answers, for the
// daemon's registry.
func (h *Health) Collectors() []prometheus.Collector {
	return []prometheus.Collector{h.healthz, h.livez}
}

// SetFamilies names the families the proxier programs ("IPv4", "IPv6"), for
// the per-family status of the body.
func (h *Health) SetFamilies(families ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.families = slices.Clone(families)
}

// Queued records that a change is waiting to be applied.
func (h *Health) Queued() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastQueued.IsZero() {
		h.lastQueued = h.now()
	}
}

// Updated records a successful sync.
func (h *Health) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.lastQueued = time.Time{}
}

// SetNode records the node as the latest snapshot has it.
func (h *Health) SetNode(n k8s.Node) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.node, h.nodeKnown = n, true
}

// Healthy reports whether no change has waited longer than the timeout,
// with the time of the last successful sync. Node eligibility does not
// count, as in kube-proxy's healthCheckNodePort servers and /livez.
func (h *Health) Healthy() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthyLocked(), h.lastUpdated
}

func (h *Health) healthyLocked() bool {
	return h.lastQueued.IsZero() || h.now().Sub(h.lastQueued) < h.Timeout
}

// NodeEligible reports whether load balancers should send to this node.
// Before the first snapshot the node counts as eligible unless a Node
// object is required.
func (h *Health) NodeEligible() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.eligibleLocked()
}

func (h *Health) eligibleLocked() bool {
	if !h.nodeKnown || h.node.Fallback {
		return !h.RequireNode
	}
	return h.node.Eligible()
}

// healthBody is kube-proxy's JSON body of /healthz and /livez.
type healthBody struct {
	LastUpdated  time.Time                `json:"lastUpdated"`
	CurrentTime  time.Time                `json:"currentTime"`
	NodeEligible *bool                    `json:"nodeEligible,omitempty"` // /healthz only
	Healthy      bool                     `json:"healthy"`
	Status       map[string]familyHealthy `json:"status,omitempty"`
}

type familyHealthy struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// body answers one request; withNode adds the node's eligibility to the
// verdict and the body, as /healthz does and /livez doesn't.
func (h *Health) body(withNode bool) (int, healthBody) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	b := healthBody{LastUpdated: h.lastUpdated, CurrentTime: now, Healthy: h.healthyLocked()}
	if !h.lastUpdated.IsZero() {
		// kube-proxy reports a family only once it synced.
		b.Status = map[string]familyHealthy{}
		for _, f := range h.families {
			b.Status[f] = familyHealthy{LastUpdated: h.lastUpdated, Healthy: b.Healthy}
		}
	}
	ok := b.Healthy
	if withNode {
		eligible := h.eligibleLocked()
		b.NodeEligible = &eligible
		ok = ok && eligible
	}
	if !ok {
		return http.StatusServiceUnavailable, b
	}
	// Like kube-proxy: a healthy answer's lastUpdated is now, which is what
	// older releases reported (the sync loop ran, whether or not it changed
	// anything); the sync metrics have the real times.
	b.LastUpdated = now
	return http.StatusOK, b
}

// Healthz answers /healthz: 200 when syncs keep up and the node is
// eligible, 503 otherwise, with kube-proxy's JSON body.
func (h *Health) Healthz() http.Handler { return h.handler(true, h.healthz) }

// Livez answers /livez: like /healthz without node eligibility, so a
// draining node's proxy is not restarted.
func (h *Health) Livez() http.Handler { return h.handler(false, h.livez) }

func (h *Health) handler(withNode bool, answers *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		code, body := h.body(withNode)
		answers.WithLabelValues(strconv.Itoa(code)).Inc()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}
