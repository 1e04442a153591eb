package proxier

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nftproxy/nftproxy/k8s"
)

func TestHealthzAndLivez(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	node := k8s.Node{Name: "node-1"}
	deleting := node
	deleting.Deleting = t0.Add(-time.Minute)
	tainted := node
	tainted.Taints = []k8s.Taint{{Key: "other", Effect: "NoSchedule"}, {Key: k8s.TaintToBeDeleted, Value: "1700000000", Effect: "NoSchedule"}}
	otherTaint := node
	otherTaint.Taints = []k8s.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: "NoSchedule"}}
	fallback := k8s.Node{Name: "node-1", Fallback: true}

	tests := []struct {
		name        string
		requireNode bool
		setNode     *k8s.Node
		// queuedAgo is how long the oldest change has waited (0: none).
		queuedAgo        time.Duration
		healthz, livez   int
		eligible         bool
		wantStatusHealth bool
	}{
		{name: "synced, eligible node", setNode: &node, healthz: 200, livez: 200, eligible: true, wantStatusHealth: true},
		{name: "change waiting less than the timeout", setNode: &node, queuedAgo: 59 * time.Second, healthz: 200, livez: 200, eligible: true, wantStatusHealth: true},
		{name: "change waiting the timeout", setNode: &node, queuedAgo: 60 * time.Second, healthz: 503, livez: 503, eligible: true},
		{name: "node being deleted", setNode: &deleting, healthz: 503, livez: 200, wantStatusHealth: true},
		{name: "ToBeDeletedByClusterAutoscaler taint", setNode: &tainted, healthz: 503, livez: 200, wantStatusHealth: true},
		{name: "another taint", setNode: &otherTaint, healthz: 200, livez: 200, eligible: true, wantStatusHealth: true},
		{name: "deleting and stale", setNode: &deleting, queuedAgo: time.Hour, healthz: 503, livez: 503},
		{name: "no Node object, manifests", setNode: &fallback, healthz: 200, livez: 200, eligible: true, wantStatusHealth: true},
		{name: "no Node object, API server", requireNode: true, setNode: &fallback, healthz: 503, livez: 200, wantStatusHealth: true},
		{name: "no snapshot yet, API server", requireNode: true, healthz: 503, livez: 200, wantStatusHealth: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(-2 * time.Hour)
			h := NewHealth(time.Minute)
			h.RequireNode = tt.requireNode
			h.now = func() time.Time { return now }
			h.SetFamilies("IPv4", "IPv6")
			h.Updated()
			synced := now
			if tt.setNode != nil {
				h.SetNode(*tt.setNode)
			}
			now = t0
			if tt.queuedAgo > 0 {
				now = t0.Add(-tt.queuedAgo)
				h.Queued()
				now = t0
			}
			for _, c := range []struct {
				path    string
				handler http.Handler
				want    int
			}{{"/healthz", h.Healthz(), tt.healthz}, {"/livez", h.Livez(), tt.livez}} {
				rec := httptest.NewRecorder()
				c.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, c.path, nil))
				if rec.Code != c.want {
					t.Errorf("%s: %d, want %d: %s", c.path, rec.Code, c.want, rec.Body)
				}
				if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
					t.Errorf("%s: Content-Type %q", c.path, ct)
				}
				var body struct {
					LastUpdated  time.Time `json:"lastUpdated"`
					CurrentTime  time.Time `json:"currentTime"`
					NodeEligible *bool     `json:"nodeEligible"`
					Healthy      bool      `json:"healthy"`
					Status       map[string]struct {
						LastUpdated time.Time `json:"lastUpdated"`
						Healthy     bool      `json:"healthy"`
					} `json:"status"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
					t.Fatalf("%s: decode %q: %v", c.path, rec.Body, err)
				}
				if !body.CurrentTime.Equal(t0) {
					t.Errorf("%s: currentTime %s, want %s", c.path, body.CurrentTime, t0)
				}
				// kube-proxy: a healthy answer's lastUpdated is now, an
				// unhealthy one's the last sync.
				wantLast := synced
				if c.want == 200 {
					wantLast = t0
				}
				if !body.LastUpdated.Equal(wantLast) {
					t.Errorf("%s: lastUpdated %s, want %s", c.path, body.LastUpdated, wantLast)
				}
				if body.Healthy != tt.wantStatusHealth {
					t.Errorf("%s: healthy %v, want %v", c.path, body.Healthy, tt.wantStatusHealth)
				}
				for _, f := range []string{"IPv4", "IPv6"} {
					if s, ok := body.Status[f]; !ok || s.Healthy != tt.wantStatusHealth || !s.LastUpdated.Equal(synced) {
						t.Errorf("%s: status[%s] %+v (present %v), want healthy %v since %s", c.path, f, s, ok, tt.wantStatusHealth, synced)
					}
				}
				switch {
				case c.path == "/livez" && body.NodeEligible != nil:
					t.Errorf("/livez: nodeEligible %v, want none", *body.NodeEligible)
				case c.path == "/healthz" && (body.NodeEligible == nil || *body.NodeEligible != tt.eligible):
					t.Errorf("/healthz: nodeEligible %v, want %v", body.NodeEligible, tt.eligible)
				}
			}
			for _, c := range []struct {
				name string
				n    float64
				code string
			}{{"healthz", counterValue(t, h.healthz.WithLabelValues(itoa(tt.healthz))), "healthz"},
				{"livez", counterValue(t, h.livez.WithLabelValues(itoa(tt.livez))), "livez"}} {
				if c.n != 1 {
					t.Errorf("kubeproxy_proxy_%s_total: %v for the answer's code, want 1", c.name, c.n)
				}
			}
		})
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func itoa(code int) string {
	b, _ := json.Marshal(code)
	return string(b)
}

// The healthCheckNodePort servers follow the proxy's health, not the
// node's eligibility, as kube-proxy's do: a draining node's /healthz fails
// for externalTrafficPolicy Cluster load balancers while its local
// endpoints keep answering for Local ones until they go.
func TestHealthyIgnoresNodeEligibility(t *testing.T) {
	h := NewHealth(time.Minute)
	h.RequireNode = true
	h.SetNode(k8s.Node{Name: "n", Taints: []k8s.Taint{{Key: k8s.TaintToBeDeleted}}})
	if ok, _ := h.Healthy(); !ok {
		t.Error("Healthy() false for an ineligible node without waiting changes")
	}
	if h.NodeEligible() {
		t.Error("NodeEligible() true with the ToBeDeletedByClusterAutoscaler taint")
	}
}
