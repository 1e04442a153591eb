package e2e

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// testClusterMetricsAsKubeProxy runs the reference kube-proxy (nftables
// mode) beside nftproxy against the same API server and objects, and
// compares their /metrics: every kube-proxy family nftproxy serves has
// kube-proxy's type, help and label names, and every kubeproxy_* family
// kube-proxy serves after a sync, nftproxy serves too.
func testClusterMetricsAsKubeProxy(t *testing.T, env *clusterEnv) {
	kubeProxyBinary(t)
	s := newClusterScenario(t, env, "e2e-metrics-ref")
	topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2r", Pods: 1})
	startReferenceKubeProxy(t, env, topo.Node, "mode: nftables\nclusterCIDR: 10.244.0.0/16\n"+
		"conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n")
	// Both trackers started before this trigger time: both observe it.
	vip := netip.MustParseAddrPort("10.96.26.10:80")
	s.service("web", vip.Addr().String(), 30260, func(svc *v1.Service) {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	a0, n0 := s.pods(0)
	s.sliceWith("web", "web-a", map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}, a0...)
	s.eventually("service", func() error { return s.answeredBy(vip, n0) })

	scrape := func(get func() (int, []byte, error)) map[string]*dto.MetricFamily {
		t.Helper()
		code, body, err := get()
		if err != nil || code != http.StatusOK {
			t.Fatalf("/metrics: %d %v", code, err)
		}
		families, err := prom.Parse(body)
		if err != nil {
			t.Fatal(err)
		}
		return families
	}
	var ref map[string]*dto.MetricFamily
	s.eventually("kube-proxy's network programming latency", func() error {
		ref = scrape(func() (int, []byte, error) { return topo.Node.Get(s.ctx, "http://127.0.0.1:10249/metrics") })
		if ref["kubeproxy_network_programming_duration_seconds"] == nil {
			return fmt.Errorf("not served yet")
		}
		return nil
	})
	// kube-proxy's /healthz was asked (to see it synced): ask nftproxy's too.
	if err := s.healthy(); err != nil {
		t.Fatal(err)
	}
	// Both proxies program the same node, so the service may have answered
	// through kube-proxy's rules while nftproxy's sync of the slice still
	// waited out its minimum sync period: wait for nftproxy's observation.
	var ours map[string]*dto.MetricFamily
	s.eventually("nftproxy's network programming latency", func() error {
		ours = scrape(func() (int, []byte, error) { return s.get("http://127.0.0.1:10249/metrics") })
		if ours["kubeproxy_network_programming_duration_seconds"] == nil {
			return fmt.Errorf("not served yet")
		}
		return nil
	})

	labelNames := func(f *dto.MetricFamily) []string {
		var out []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			out = append(out, l.GetName())
		}
		slices.Sort(out)
		return out
	}
	compared := 0
	for name, want := range ref {
		if !strings.HasPrefix(name, "kubeproxy_") && !strings.HasPrefix(name, "rest_client_") && name != "kubernetes_build_info" {
			continue
		}
		got := ours[name]
		if got == nil {
			// kube-proxy's, not nftproxy's: the iptables-restore and the
			// partial sync failure counters of other modes are never
			// registered in nftables mode; anything else is missing.
			if strings.HasPrefix(name, "kubeproxy_") {
				t.Errorf("%s: served by kube-proxy, not by nftproxy", name)
			}
			continue
		}
		compared++
		if got.GetType() != want.GetType() {
			t.Errorf("%s: type %v, kube-proxy's %v", name, got.GetType(), want.GetType())
		}
		// component-base prefixes the help with the stability level.
		h := want.GetHelp()
		for _, level := range []string{"[ALPHA] ", "[BETA] ", "[STABLE] "} {
			h = strings.TrimPrefix(h, level)
		}
		if got.GetHelp() != h {
			t.Errorf("%s: help %q, kube-proxy's %q", name, got.GetHelp(), h)
		}
		if g, w := labelNames(got), labelNames(want); !slices.Equal(g, w) {
			t.Errorf("%s: labels %v, kube-proxy's %v", name, g, w)
		}
		if want.GetType() == dto.MetricType_HISTOGRAM {
			var gb, wb []float64
			for _, b := range got.GetMetric()[0].GetHistogram().GetBucket() {
				gb = append(gb, b.GetUpperBound())
			}
			for _, b := range want.GetMetric()[0].GetHistogram().GetBucket() {
				wb = append(wb, b.GetUpperBound())
			}
			if !slices.Equal(gb, wb) {
				t.Errorf("%s: buckets %v, kube-proxy's %v", name, gb, wb)
			}
		}
	}
	t.Logf("compared %d families with kube-proxy's", compared)
	if compared < 15 {
		t.Errorf("compared only %d families", compared)
	}
}
