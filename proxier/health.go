package proxier

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Health tracks whether syncs keep up with changes, like kube-proxy's
// healthz server: unhealthy when a change has waited longer than Timeout
// without a successful sync.
type Health struct {
	Timeout time.Duration
	now     func() time.Time

	mu          sync.Mutex
	lastQueued  time.Time // oldest change not yet applied; zero when none
	lastUpdated time.Time
}

// NewHealth returns a Health with the given staleness timeout.
func NewHealth(timeout time.Duration) *Health {
	return &Health{Timeout: timeout, now: time.Now}
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

// Healthy reports whether no change has waited longer than the timeout,
// with the time of the last successful sync.
func (h *Health) Healthy() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ok := h.lastQueued.IsZero() || h.now().Sub(h.lastQueued) < h.Timeout
	return ok, h.lastUpdated
}

// ServeHTTP answers /healthz and /livez: 200 when healthy, 503 otherwise,
// with kube-proxy's JSON body.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	ok, last := h.Healthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(struct {
		LastUpdated string `json:"lastUpdated"`
		CurrentTime string `json:"currentTime"`
		NodeHealthy bool   `json:"nodeHealthy"`
	}{last.Format(time.RFC3339Nano), h.now().Format(time.RFC3339Nano), ok})
}
