package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// TestHealthCheckNodePortAddresses: the healthCheckNodePort server listens
// where NodePorts are served, as kube-proxy's does: by default (primary)
// on the node's primary address only, so a secondary address and the
// node's loopback refuse; with --nodeport-addresses on every local address
// in the CIDRs.
func TestHealthCheckNodePortAddresses(t *testing.T) {
	if binary == "" {
		netns.Require(t)
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	const hcPort = 32100
	secondary := netip.MustParseAddr("192.168.77.50")
	url := func(a netip.Addr) string { return fmt.Sprintf("http://%s/", netip.AddrPortFrom(a, hcPort)) }
	// check asks the health check on the primary address (200: the one
	// endpoint is on node-1), the secondary one and the node's loopback.
	check := func(t *testing.T, topo *netns.Topology, who string, secondaryAnswers bool) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		clusterEventually(ctx, t, who+": health check on the primary address", func() error {
			code, body, err := topo.Client.Get(ctx, url(topo.NodeAddr))
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			return err
		})
		code, body, err := topo.Client.Get(ctx, url(secondary))
		switch {
		case secondaryAnswers && (err != nil || code != 200):
			t.Errorf("%s: health check on the secondary address %s: %d %s %v, want 200", who, secondary, code, body, err)
		case !secondaryAnswers && !clusterRefused(err):
			t.Errorf("%s: health check on the secondary address %s: %d %s %v, want the connection refused", who, secondary, code, body, err)
		}
		if code, body, err := topo.Node.Get(ctx, url(netip.MustParseAddr("127.0.0.1"))); !clusterRefused(err) {
			t.Errorf("%s: health check on the node's 127.0.0.1: %d %s %v, want the connection refused", who, code, body, err)
		}
	}
	setup := func(t *testing.T) *netns.Topology {
		topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2h", Pods: 1})
		if _, err := topo.Node.IP("addr", "add", secondary.String()+"/24", "dev", netns.NodeUplink); err != nil {
			t.Fatal(err)
		}
		return topo
	}
	// The reference: kube-proxy in nftables mode, the same objects.
	t.Run("KubeProxy", func(t *testing.T) {
		kubeProxyBinary(t)
		env := newClusterEnv(t)
		topo := setup(t)
		env.createNodePortService(t.Context(), t, "e2e-hc", "web", "10.96.0.79", 30081, topo.Pods[0].Addr.String(), func(svc *v1.Service) {
			svc.Spec.Type = v1.ServiceTypeLoadBalancer
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			svc.Spec.HealthCheckNodePort = hcPort
		})
		startReferenceKubeProxy(t, env, topo.Node, "mode: nftables\nclusterCIDR: 10.244.0.0/16\n"+
			"conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n")
		check(t, topo, "kube-proxy", false)
	})
	for _, tt := range []struct {
		name      string
		args      []string
		secondary bool // the secondary address answers
	}{
		{"Primary", nil, false},
		{"CIDRs", []string{"--nodeport-addresses", "192.168.77.0/24"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topo := setup(t)
			// healthCheckNodePort is a LoadBalancer's with externalTrafficPolicy Local.
			manifest := semSvc{name: "web", typ: "LoadBalancer", clusterIPs: []string{"10.96.0.79"}, nodePort: 30081,
				spec: fmt.Sprintf("  externalTrafficPolicy: Local\n  healthCheckNodePort: %d\n", hcPort),
				v4:   []semEP{{addr: topo.Pods[0].Addr.String()}}}.yaml()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			startOnManifest(ctx, t, topo, manifest, append([]string{"--node-ip", topo.NodeAddr.String()}, tt.args...)...)
			check(t, topo, "nftproxy", tt.secondary)
		})
	}
}
