package k8s

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestClientMetrics: a request through client-go shows in the rest_client_*
// metrics, with Kubernetes' labels.
func TestClientMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"36","gitVersion":"v1.36.3"}`))
	}))
	defer srv.Close()
	cm, reg := testClientMetrics()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.URL)
	if got := testutil.ToFloat64(cm.Requests.WithLabelValues("200", "GET", u.Host)); got != 1 {
		t.Errorf("rest_client_requests_total{code=200,method=GET,host=%s} = %v, want 1", u.Host, got)
	}
	for _, name := range []string{"rest_client_request_duration_seconds", "rest_client_response_size_bytes",
		"rest_client_rate_limiter_duration_seconds", "rest_client_requests_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n == 0 {
			t.Errorf("%s: %d series (%v), want the request's", name, n, err)
		}
	}
}

// testClientMetrics registers client-go's adapters once per test binary,
// as client-go takes one set per process; each run of TestClientMetrics
// asks a server of its own, so its host label tells its series apart.
var testClientMetrics = sync.OnceValues(func() (*ClientMetrics, *prometheus.Registry) {
	cm := NewClientMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(cm.Collectors()...)
	RegisterClientMetrics(cm)
	return cm, reg
})
