package proxier

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
)

// HealthChecks serves the healthCheckNodePort of every service with
// externalTrafficPolicy Local, like kube-proxy: load balancers ask it whether
// this node has local endpoints. 200 only when it has and the proxy is
// healthy, 503 otherwise, with kube-proxy's JSON body.
type HealthChecks struct {
	log    *zap.Logger
	health *Health
	listen func(port uint16) (net.Listener, error)

	mu      sync.Mutex
	servers map[uint16]*hcServer
}

type hcServer struct {
	srv *http.Server

	mu             sync.Mutex
	namespace      string
	name           string
	localEndpoints int
}

// NewHealthChecks returns servers that listen on every address of the
// daemon's network namespace.
func NewHealthChecks(log *zap.Logger, health *Health) *HealthChecks {
	return &HealthChecks{log: log, health: health, servers: map[uint16]*hcServer{},
		listen: func(port uint16) (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf(":%d", port)) }}
}

// Update opens and closes servers to match snap, and updates the counts of
// local endpoints they report.
func (h *HealthChecks) Update(snap *k8s.Snapshot) {
	type want struct {
		namespace, name string
		local           map[netip.Addr]bool
	}
	wanted := map[uint16]*want{}
	for i := range snap.Services {
		sp := &snap.Services[i]
		if !sp.ExternalPolicyLocal || sp.HealthCheckNodePort == 0 {
			continue
		}
		w := wanted[sp.HealthCheckNodePort]
		if w == nil {
			w = &want{namespace: sp.Name.Namespace, name: sp.Name.Name, local: map[netip.Addr]bool{}}
			wanted[sp.HealthCheckNodePort] = w
		}
		// Like kube-proxy: distinct local addresses that are ready, so a
		// node whose pods are all terminating drains (503).
		for _, e := range sp.Endpoints {
			if e.Ready && snap.Node.Name != "" && e.NodeName == snap.Node.Name {
				w.local[e.Addr] = true
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		if wanted[port] == nil {
			_ = s.srv.Close()
			delete(h.servers, port)
		}
	}
	for port, w := range wanted {
		s := h.servers[port]
		if s == nil {
			l, err := h.listen(port)
			if err != nil {
				// Retried on the next update; the rules don't depend on it.
				h.log.Error("Cannot serve health check node port", zap.Uint16("port", port),
					zap.String("service", w.namespace+"/"+w.name), zap.Error(err))
				continue
			}
			s = &hcServer{}
			s.srv = &http.Server{Handler: h.handler(s), ReadHeaderTimeout: 5 * time.Second}
			go func() {
				if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					h.log.Error("Health check server failed", zap.Uint16("port", port), zap.Error(err))
				}
			}()
			h.servers[port] = s
		}
		s.mu.Lock()
		s.namespace, s.name, s.localEndpoints = w.namespace, w.name, len(w.local)
		s.mu.Unlock()
	}
}

// Close stops every server.
func (h *HealthChecks) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		_ = s.srv.Close()
		delete(h.servers, port)
	}
}

func (h *HealthChecks) handler(s *hcServer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		body := struct {
			Service struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
			LocalEndpoints      int  `json:"localEndpoints"`
			ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
		}{LocalEndpoints: s.localEndpoints}
		body.Service.Namespace, body.Service.Name = s.namespace, s.name
		s.mu.Unlock()
		body.ServiceProxyHealthy, _ = h.health.Healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		// Load balancers that weigh nodes read the local endpoint count
		// here, as kube-proxy sends it.
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(body.LocalEndpoints))
		if body.LocalEndpoints == 0 || !body.ServiceProxyHealthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
}
