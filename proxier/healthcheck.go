package proxier

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// HealthChecks serves the healthCheckNodePort of every service with
// externalTrafficPolicy Local, like kube-proxy: load balancers ask it whether
// this node has local endpoints. 200 only when it has and the proxy is
// healthy, 503 otherwise, with kube-proxy's JSON body.
type HealthChecks struct {
	log    *zap.Logger
	health *Health
	opts   HealthCheckOptions

	mu      sync.Mutex
	servers map[uint16]*hcServer
	// What the last Update and the Changes since asked for, the node they
	// counted for, and where the servers listen (nil: not listed yet).
	wants map[uint16]*hcWant
	node  k8s.Node
	addrs []netip.Addr
}

// HealthCheckOptions say where the servers listen: on the NodePort
// addresses of each family the Configs program, as kube-proxy's do.
type HealthCheckOptions struct {
	// Configs are the proxier's; none: every address of every family.
	Configs []Config
	// LocalAddrs lists the namespace's addresses, for NodePort addresses
	// given as CIDRs.
	LocalAddrs func() ([]netip.Addr, error)
	// Listen opens a listener (default: net.Listen).
	Listen func(network string, addr netip.AddrPort) (net.Listener, error)
	// BindFailures counts ports that could not be bound (optional).
	BindFailures prometheus.Counter
}

type hcServer struct {
	addrs []netip.AddrPort // where it listens
	srvs  []*http.Server

	mu             sync.Mutex
	namespace      string
	name           string
	localEndpoints int
}

// NewHealthChecks returns servers that listen where opts say.
func NewHealthChecks(log *zap.Logger, health *Health, opts HealthCheckOptions) *HealthChecks {
	if opts.Listen == nil {
		opts.Listen = func(network string, addr netip.AddrPort) (net.Listener, error) {
			if !addr.Addr().IsValid() {
				return net.Listen(network, fmt.Sprintf(":%d", addr.Port()))
			}
			return net.Listen(network, addr.String())
		}
	}
	return &HealthChecks{log: log, health: health, opts: opts, servers: map[uint16]*hcServer{}, wants: map[uint16]*hcWant{}}
}

// listenAddrs are the addresses the servers listen on, as kube-proxy
// picks them for each family: the node's primary address with NodePorts on
// "primary", the local addresses in the NodePort CIDRs otherwise, and the
// family's every address (unspecified) when it has neither.
func listenAddrs(cfgs []Config, node *k8s.Node, local []netip.Addr) []netip.Addr {
	if len(cfgs) == 0 {
		return []netip.Addr{{}} // one dual-stack wildcard
	}
	var out []netip.Addr
	for _, cfg := range cfgs {
		every := netip.IPv4Unspecified()
		if cfg.Family == m.IPv6 {
			every = netip.IPv6Unspecified()
		}
		if cfg.NodePortPrimary {
			if a := primaryAddr(cfg, node); a.IsValid() && !a.IsLoopback() {
				out = append(out, a)
			} else {
				out = append(out, every)
			}
			continue
		}
		var prefixes []netip.Prefix
		for _, p := range cfg.NodePortAddresses {
			if cfg.inFamily(p) {
				prefixes = append(prefixes, p)
			}
		}
		if len(prefixes) == 0 || slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
			out = append(out, every)
			continue
		}
		found := false
		for _, a := range local {
			if cfg.addrInFamily(a) && slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
				out = append(out, a)
				found = true
			}
		}
		if !found {
			// kube-proxy listens on every address then, with an error.
			out = append(out, every)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Update opens and closes servers to match snap, and updates the counts of
// local endpoints they report.
func (h *HealthChecks) Update(snap *k8s.Snapshot) {
	wants := map[uint16]*hcWant{}
	for i := range snap.Services {
		addWant(wants, &snap.Services[i], snap.Node.Name, snap.Services[i].Endpoints, 1)
	}
	var addrs []netip.Addr
	if len(wants) > 0 {
		addrs = h.listenAddrs(&snap.Node)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wants, h.node, h.addrs = wants, snap.Node, addrs
	for port, s := range h.servers {
		if wants[port] == nil || !slices.Equal(s.addrs, listenAddrPorts(addrs, port)) {
			s.close()
			delete(h.servers, port)
		}
	}
	for port := range wants {
		h.reconcile(port)
	}
}

// Change brings the servers along the changed service ports of a delta
// sync on the node of the last Update (the caller updates in full when the
// node changed): only the health check node ports they use are looked at,
// and an endpoint delta counts only the endpoints that changed.
func (h *HealthChecks) Change(ports []portChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	touched := map[uint16]bool{}
	for _, pc := range ports {
		old, new := healthPort(pc.old), healthPort(pc.new)
		if w := h.wants[old]; pc.delta != nil && old != 0 && old == new && w != nil {
			countLocal(w, h.node.Name, pc.delta.Removed, -1)
			countLocal(w, h.node.Name, pc.delta.Added, 1)
			touched[old] = true
			continue
		}
		if old != 0 {
			addWant(h.wants, pc.old, h.node.Name, pc.old.Endpoints, -1)
			touched[old] = true
		}
		if new != 0 {
			addWant(h.wants, pc.new, h.node.Name, pc.new.Endpoints, 1)
			touched[new] = true
		}
	}
	for port := range touched {
		if h.wants[port] != nil && h.addrs == nil {
			h.addrs = h.listenAddrs(&h.node)
		}
		h.reconcile(port)
	}
}

// hcWant is what the service ports using one health check node port ask of
// its server.
type hcWant struct {
	namespace, name string
	users           int // service ports
	// Like kube-proxy: distinct local addresses that are ready, so a node
	// whose pods are all terminating drains (503). Counted by the endpoints
	// of the users that have each.
	local map[netip.Addr]int
}

// healthPort is the health check node port sp uses; 0: none (sp nil, or
// not externalTrafficPolicy Local).
func healthPort(sp *k8s.ServicePort) uint16 {
	if sp == nil || !sp.ExternalPolicyLocal {
		return 0
	}
	return sp.HealthCheckNodePort
}

// addWant counts sp in (sign 1) or out (sign -1) of wants, with eps, its
// endpoints, counted for node.
func addWant(wants map[uint16]*hcWant, sp *k8s.ServicePort, node string, eps []k8s.Endpoint, sign int) {
	port := healthPort(sp)
	if port == 0 {
		return
	}
	w := wants[port]
	if w == nil {
		w = &hcWant{namespace: sp.Name.Namespace, name: sp.Name.Name, local: map[netip.Addr]int{}}
		wants[port] = w
	}
	w.users += sign
	countLocal(w, node, eps, sign)
	if w.users == 0 {
		delete(wants, port)
	}
}

func countLocal(w *hcWant, node string, eps []k8s.Endpoint, sign int) {
	for i := range eps {
		if e := &eps[i]; e.Ready && node != "" && e.NodeName == node {
			if w.local[e.Addr] += sign; w.local[e.Addr] == 0 {
				delete(w.local, e.Addr)
			}
		}
	}
}

// listenAddrs lists where the servers listen on node.
func (h *HealthChecks) listenAddrs(node *k8s.Node) []netip.Addr {
	var local []netip.Addr
	if h.opts.LocalAddrs != nil {
		var err error
		if local, err = h.opts.LocalAddrs(); err != nil {
			h.log.Error("Listing local addresses failed; health check node ports listen on every address", zap.Error(err))
		}
	}
	return listenAddrs(h.opts.Configs, node, local)
}

// reconcile opens or closes port's server as its want says, and sets what
// it reports; h.mu is held.
func (h *HealthChecks) reconcile(port uint16) {
	w, s := h.wants[port], h.servers[port]
	if w == nil {
		if s != nil {
			s.close()
			delete(h.servers, port)
		}
		return
	}
	if s == nil {
		var err error
		if s, err = h.serve(port, h.addrs); err != nil {
			// Retried on the next update; the rules don't depend on it.
			if h.opts.BindFailures != nil {
				h.opts.BindFailures.Inc()
			}
			h.log.Error("Cannot serve health check node port", zap.Uint16("port", port),
				zap.String("service", w.namespace+"/"+w.name), zap.Error(err))
			return
		}
		h.servers[port] = s
	}
	s.mu.Lock()
	s.namespace, s.name, s.localEndpoints = w.namespace, w.name, len(w.local)
	s.mu.Unlock()
}

// serve listens on port of every address, all or none.
func (h *HealthChecks) serve(port uint16, addrs []netip.Addr) (*hcServer, error) {
	s := &hcServer{addrs: listenAddrPorts(addrs, port)}
	for _, ap := range s.addrs {
		network := "tcp"
		switch {
		case ap.Addr().Is4():
			network = "tcp4"
		case ap.Addr().Is6():
			network = "tcp6"
		}
		l, err := h.opts.Listen(network, ap)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("listen on %s: %w", ap, err)
		}
		srv := &http.Server{Handler: h.handler(s), ReadHeaderTimeout: 5 * time.Second}
		s.srvs = append(s.srvs, srv)
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error("Health check server failed", zap.Stringer("address", ap), zap.Error(err))
			}
		}()
	}
	return s, nil
}

func listenAddrPorts(addrs []netip.Addr, port uint16) []netip.AddrPort {
	out := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		out[i] = netip.AddrPortFrom(a, port)
	}
	return out
}

func (s *hcServer) close() {
	for _, srv := range s.srvs {
		_ = srv.Close()
	}
}

// Close stops every server.
func (h *HealthChecks) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		s.close()
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
