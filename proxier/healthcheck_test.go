package proxier

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
)

func TestHealthCheckNodePort(t *testing.T) {
	hc := NewHealthChecks(zap.NewNop(), NewHealth(60e9))
	ports := map[uint16]string{}
	hc.listen = func(port uint16) (net.Listener, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0") // the test can't pick the port
		if err == nil {
			ports[port] = l.Addr().String()
		}
		return l, err
	}
	defer hc.Close()
	web := svc("web", "http", "10.96.0.10", 2, local(1), func(sp *k8s.ServicePort) {
		sp.ExternalPolicyLocal, sp.HealthCheckNodePort = true, 32000
	})
	ask := func() (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://%s/healthz", ports[32000]))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != fmt.Sprint(body["localEndpoints"]) {
			t.Errorf("X-Load-Balancing-Endpoint-Weight %q, localEndpoints %v: want the same count, as kube-proxy sends", w, body["localEndpoints"])
		}
		return resp.StatusCode, body
	}

	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web}, Node: k8s.Node{Name: "node-1"}})
	if code, body := ask(); code != 200 || body["localEndpoints"].(float64) != 1 {
		t.Errorf("with a local endpoint: %d %v, want 200 and 1", code, body)
	}
	https := web
	https.Name.Port, https.Port = "https", 443 // same pod: still one local endpoint
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web, https}, Node: k8s.Node{Name: "node-1"}})
	if code, body := ask(); code != 200 || body["localEndpoints"].(float64) != 1 {
		t.Errorf("two ports of one local pod: %d %v, want 200 and 1", code, body)
	}
	terminating := web
	terminating.Endpoints = []k8s.Endpoint{{Addr: web.Endpoints[0].Addr, Port: 8080, Serving: true, Terminating: true, NodeName: "node-1"}}
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{terminating}, Node: k8s.Node{Name: "node-1"}})
	if code, _ := ask(); code != 503 {
		t.Errorf("only a terminating local pod: %d, want 503 so the load balancer drains the node", code)
	}
	hc.Update(&k8s.Snapshot{Services: []k8s.ServicePort{web}, Node: k8s.Node{Name: "node-3"}})
	if code, body := ask(); code != 503 || body["localEndpoints"].(float64) != 0 {
		t.Errorf("without local endpoints: %d %v, want 503 and 0", code, body)
	}
	hc.Update(&k8s.Snapshot{})
	if _, err := http.Get(fmt.Sprintf("http://%s/healthz", ports[32000])); err == nil {
		t.Error("the server of a deleted service still answers")
	}
}
