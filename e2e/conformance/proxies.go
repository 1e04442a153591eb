package conformance

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// proxyIdentity is the proxies' user: deploy/'s ServiceAccount, so the run
// also checks that deploy/rbac.yaml grants what the suite's traffic needs.
const proxyIdentity = "system:serviceaccount:kube-system:nftproxy"

// proxyKubeconfig writes (once) the proxies' kubeconfig, through the relay
// as proxyIdentity, after creating deploy/'s ServiceAccount and RBAC.
func (c *Cluster) proxyKubeconfig() (string, error) {
	path := filepath.Join(c.Dir, "proxy-kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deploy := filepath.Join(sourceDir(), "..", "..", "deploy")
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		if out, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(deploy, f)); err != nil {
			return "", fmt.Errorf("apply %s: %w: %s", f, err, out)
		}
	}
	api := netip.AddrPortFrom(netns.FabricAddr, apiPort).String()
	return path, apiserver.RelayedKubeconfig(c.API.Kubeconfig, api, proxyIdentity, path)
}

// NFTProxy runs the nftproxy binary on every node, with the flags an
// operator gives it in place of kube-proxy.
func NFTProxy(binary string) Proxy {
	return Proxy{Name: "nftproxy", Start: func(c *Cluster, n *netns.ClusterNode) (*e2e.Daemon, error) {
		kc, err := c.proxyKubeconfig()
		if err != nil {
			return nil, err
		}
		return e2e.Start(n.NS, binary, "--kubeconfig", kc, "--hostname-override", n.Name,
			"--cluster-cidr", ClusterCIDR, "--healthz-bind-address", fmt.Sprintf("0.0.0.0:%d", healthzPort),
			"--metrics-bind-address", "127.0.0.1:10249", "-v", "2")
	}}
}

// KubeProxy runs the reference kube-proxy (e2e/apiserver/build.sh's, the
// API server's version) in nftables mode on every node.
func KubeProxy() Proxy {
	return Proxy{Name: "kube-proxy", Start: func(c *Cluster, n *netns.ClusterNode) (*e2e.Daemon, error) {
		kc, err := c.proxyKubeconfig()
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(c.Dir, n.Name, "kube-proxy.yaml")
		body := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 0.0.0.0:%d
metricsBindAddress: 127.0.0.1:10249
conntrack:
  # nf_conntrack_max is the init namespace's alone: kube-proxy cannot set
  # it from a node's namespace and exits if asked to (kind sets 0 too).
  maxPerCore: 0
`, kc, n.Name, ClusterCIDR, healthzPort)
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			return nil, err
		}
		return e2e.StartCommand(n.NS, filepath.Join(apiserver.DefaultBinDir(), "kube-proxy"), "--config", cfg, "-v", "2")
	}}
}
