package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// ClusterCIDR holds every node's pod CIDR (node i has 10.244.i.0/24).
const ClusterCIDR = "10.244.0.0/16"

// apiPort is where the relay to kube-apiserver listens in the fabric, for
// the nodes, the pods (the kubernetes Service's endpoint) and e2e.test.
const apiPort = 6443

// healthzPort is where each node's proxy serves /healthz (kube-proxy's
// default), on the node's address so the harness reaches it over the fabric.
const healthzPort = 10256

// Proxy is the service proxy every node runs.
type Proxy struct {
	// Name is how the results name it: "nftproxy" or "kube-proxy".
	Name string
	// Start runs it on node n of c.
	Start func(c *Cluster, n *netns.ClusterNode) (*e2e.Daemon, error)
	// Deploy, in place of Start, puts it on every node through the API
	// server (a DaemonSet), once the nodes are Ready.
	Deploy func(ctx context.Context, c *Cluster) error
}

// Options choose the cluster.
type Options struct {
	// Bins holds kubelet, kube-scheduler, kubectl, e2e.test and the images
	// (build.sh's output directory).
	Bins  string
	Nodes int // 0 means 2
	// Procs above 1 runs e2e.test in that many parallel processes under
	// the ginkgo CLI (Bins/ginkgo), as Kubernetes' CI does; specs marked
	// [Serial] must then be skipped.
	Procs int
	Proxy Proxy
	// ExtraImages are OCI archives every node imports beside Bins/images.
	ExtraImages []string
	Logf        func(format string, args ...any)
}

// Cluster is a running cluster of real nodes: an API server with its
// controller manager and scheduler on the host's loopback, and per node a
// network namespace running containerd, kubelet and the proxy.
type Cluster struct {
	Topo   *netns.ClusterTopology
	API    *apiserver.Server
	Client kubernetes.Interface
	// FabricKubeconfig is the admin's kubeconfig through the relay in the
	// fabric, for what runs in a namespace: kubelets, e2e.test, kubectl.
	FabricKubeconfig string
	Dir              string

	opts       Options
	cgroupRoot string
	sysctls    savedSysctls
	egress     *egressProxy
	relay      *netns.Relay
	scheduler  *e2e.Daemon
	nodes      []*e2e.Daemon // node.sh, one per node
	proxies    []*e2e.Daemon
	lock       *os.File
}

// Start brings the cluster up and returns once every node is Ready and
// CoreDNS answers. On error everything made so far is removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	c := &Cluster{opts: opts, cgroupRoot: fmt.Sprintf("/nftproxy-conformance-%d", os.Getpid())}
	// Kubelet's sysctls are the machine's: two clusters at once would each
	// record the other's values as the ones to put back.
	if c.lock, err = lockMachine(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("start conformance cluster: %w", err), c.Close())
		}
	}()
	if c.Dir, err = os.MkdirTemp("", "nftproxy-conformance-"); err != nil {
		return c, err
	}
	if c.sysctls, err = saveSysctls(); err != nil {
		return c, err
	}
	c.logf("building %d nodes in network namespaces", opts.Nodes)
	if c.Topo, err = netns.BuildCluster(netns.ClusterOptions{Prefix: "npc", Nodes: opts.Nodes, KubeletPods: true}); err != nil {
		return c, err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return c, err
	}
	for _, n := range c.Topo.Nodes {
		if err := makeCgroup(c.cgroupRoot + "/" + n.Name); err != nil {
			return c, err
		}
		if err := c.startNode(ctx, n); err != nil {
			return c, err
		}
	}
	if err := c.waitNodesReady(ctx); err != nil {
		return c, err
	}
	c.logf("nodes Ready; starting %s on every node", opts.Proxy.Name)
	if err := c.startProxies(ctx); err != nil {
		return c, err
	}
	if err := c.deployDNS(ctx); err != nil {
		return c, err
	}
	return c, nil
}

// startProxies runs the proxy on every node and waits for it to be healthy.
func (c *Cluster) startProxies(ctx context.Context) error {
	if c.opts.Proxy.Deploy != nil {
		return c.opts.Proxy.Deploy(ctx, c)
	}
	for _, n := range c.Topo.Nodes {
		d, err := c.opts.Proxy.Start(c, n)
		if err != nil {
			return fmt.Errorf("start %s on %s: %w", c.opts.Proxy.Name, n.Name, err)
		}
		c.proxies = append(c.proxies, d)
	}
	return c.waitProxiesHealthy(ctx)
}

// waitProxiesHealthy waits for every node's proxy to answer /healthz with
// 200 (it has synced), so that a proxy that exits or never syncs fails the
// start with its log rather than, minutes later, as pods that cannot reach
// the API server.
func (c *Cluster) waitProxiesHealthy(ctx context.Context) error {
	for i, n := range c.Topo.Nodes {
		d := c.proxies[i]
		url := fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.Addr, healthzPort))
		err := retry(ctx, 90*time.Second, func() error {
			if d.Exited() {
				return permanent(errors.New("exited"))
			}
			code, _, err := c.Topo.Fabric.Get(ctx, url)
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("%s answered %d", url, code)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s on %s: %w; its log ends:\n%s", c.opts.Proxy.Name, n.Name, err, d.LogTail(20))
		}
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

// startControlPlane runs etcd, kube-apiserver (its cluster traffic through
// the egress proxy), the relay, kube-controller-manager and kube-scheduler,
// and gives the kubernetes Service its endpoint, the relay.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	sock := filepath.Join(c.Dir, "egress.sock")
	var err error
	if c.egress, err = startEgressProxy(sock, c.Topo.Fabric); err != nil {
		return err
	}
	egressFile := filepath.Join(c.Dir, "egress.yaml")
	if err := os.WriteFile(egressFile, []byte(egressConfig(sock)), 0o644); err != nil {
		return err
	}
	c.logf("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
	// Real pods: service-account tokens are mounted as in any cluster.
	if c.API, err = apiserver.Start(ctx, apiserver.Options{ServiceAccounts: true, APIServerFlags: []string{
		"--egress-selector-config-file=" + egressFile,
		// Node names do not resolve; their InternalIP is routed by the fabric.
		"--kubelet-preferred-address-types=InternalIP",
	}}); err != nil {
		return err
	}
	cfg := rest.CopyConfig(c.API.RestConfig)
	cfg.WarningHandler = rest.NoWarnings{}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	u, err := url.Parse(c.API.URL)
	if err != nil {
		return err
	}
	fabricAPI := netip.AddrPortFrom(netns.FabricAddr, apiPort)
	if c.relay, err = netns.StartRelay(c.Topo.Fabric, fabricAPI.String(), u.Host); err != nil {
		return err
	}
	c.FabricKubeconfig = filepath.Join(c.Dir, "fabric-kubeconfig")
	if err := apiserver.RelayedKubeconfig(c.API.Kubeconfig, fabricAPI.String(), "", c.FabricKubeconfig); err != nil {
		return err
	}
	if err := c.API.StartControllerManager(ctx, "*"); err != nil {
		return err
	}
	if c.scheduler, err = e2e.StartCommand(c.Topo.Fabric, filepath.Join(c.opts.Bins, "kube-scheduler"),
		"--kubeconfig="+c.FabricKubeconfig, "--authentication-kubeconfig="+c.FabricKubeconfig,
		"--authorization-kubeconfig="+c.FabricKubeconfig, "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port=10259"); err != nil {
		return err
	}
	return c.kubernetesEndpoint(ctx, fabricAPI)
}

// kubernetesEndpoint points default/kubernetes at the relay: the API server
// runs with no endpoint reconciler (its own address is loopback).
func (c *Cluster) kubernetesEndpoint(ctx context.Context, at netip.AddrPort) error {
	port := int32(at.Port())
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{at.Addr().String()}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: &port, Protocol: ptr(v1.ProtocolTCP)}},
	}
	return retry(ctx, 30*time.Second, func() error {
		_, err := c.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, slice, metav1.CreateOptions{})
		return err
	})
}

// startNode creates the Node object (name, address, pod CIDR: kubelet
// registers into it) and runs node.sh in the node's namespace.
func (c *Cluster) startNode(ctx context.Context, n *netns.ClusterNode) error {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{v1.LabelHostname: n.Name, v1.LabelOSStable: "linux"}},
		Spec:       v1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	dir := filepath.Join(c.Dir, n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	images, err := c.imagesDir()
	if err != nil {
		return err
	}
	// A UTS namespace of its own, so that the node has its name as its
	// hostname: hostNetwork pods answer with it, and the suite expects the
	// node's name.
	d, err := e2e.StartCommand(n.NS, "unshare", "--uts", "bash", filepath.Join(sourceDir(), "node.sh"), dir, n.Name, n.Addr.String(),
		n.PodCIDR.String(), c.FabricKubeconfig, c.cgroupRoot+"/"+n.Name, images,
		filepath.Join(c.opts.Bins, "kubelet"))
	if err != nil {
		return err
	}
	c.nodes = append(c.nodes, d)
	return nil
}

// imagesDir is the directory of archives the nodes import: Bins/images,
// or links to its archives and to Options.ExtraImages.
func (c *Cluster) imagesDir() (string, error) {
	bins := filepath.Join(c.opts.Bins, "images")
	if len(c.opts.ExtraImages) == 0 {
		return bins, nil
	}
	dir := filepath.Join(c.Dir, "images")
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tars, err := filepath.Glob(filepath.Join(bins, "*.tar"))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, t := range append(tars, c.opts.ExtraImages...) {
		if err := os.Symlink(t, filepath.Join(dir, filepath.Base(t))); err != nil {
			return "", fmt.Errorf("link image archive: %w", err)
		}
	}
	return dir, nil
}

// waitNodesReady waits for every kubelet to report its node Ready.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	return retry(ctx, 3*time.Minute, func() error {
		for i, n := range c.Topo.Nodes {
			if c.nodes[i].Exited() {
				return permanent(fmt.Errorf("node %s: node.sh exited: %s\nkubelet log tail:\n%s", n.Name, c.nodes[i].Log(), c.tail(n, "kubelet.log")))
			}
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, cond := range node.Status.Conditions {
				if cond.Type == v1.NodeReady && cond.Status == v1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				return fmt.Errorf("node %s not Ready; kubelet log tail:\n%s", n.Name, c.tail(n, "kubelet.log"))
			}
		}
		return nil
	})
}

// tail is the end of one of node n's logs.
func (c *Cluster) tail(n *netns.ClusterNode, log string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, n.Name, log))
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// deployDNS runs CoreDNS behind kube-dns (10.96.0.10) and waits for it.
func (c *Cluster) deployDNS(ctx context.Context) error {
	c.logf("deploying CoreDNS")
	if out, err := c.Kubectl(ctx, "apply", "-f", filepath.Join(sourceDir(), "coredns.yaml")); err != nil {
		return fmt.Errorf("apply coredns.yaml: %w: %s", err, out)
	}
	out, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=3m")
	if err != nil {
		logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", "deployment/coredns", "--tail=20")
		pods, _ := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-o", "wide")
		return fmt.Errorf("wait for CoreDNS: %w: %s\n%s\nlogs:\n%s", err, out, pods, logs)
	}
	return nil
}

// Kubectl runs kubectl in the fabric namespace as the admin.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.Topo.Fabric.ExecContext(ctx, append([]string{filepath.Join(c.opts.Bins, "kubectl"), "--kubeconfig", c.FabricKubeconfig}, args...)...)
}

// Close stops everything and removes the namespaces, cgroups and files,
// also after a partial start, and puts back the sysctls kubelet changed.
func (c *Cluster) Close() error {
	var errs []error
	for i, d := range c.proxies {
		d.Kill()
		// Kept beside kubelet.log: a failed run is read from the directory.
		if c.Dir != "" {
			_ = os.WriteFile(filepath.Join(c.Dir, c.Topo.Nodes[i].Name, "proxy.log"), []byte(d.Log()), 0o644)
		}
	}
	for _, d := range c.nodes {
		d.Terminate(30 * time.Second)
	}
	if c.Topo != nil {
		for _, n := range c.Topo.Nodes {
			if n.NS != nil {
				killNamespace(n.NS.Name())
			}
		}
	}
	if err := removeCgroupRoot(c.cgroupRoot); err != nil {
		errs = append(errs, err)
	}
	if c.scheduler != nil {
		c.scheduler.Kill()
	}
	if c.relay != nil {
		c.relay.Close()
	}
	if c.API != nil {
		c.API.Stop()
	}
	if c.egress != nil {
		c.egress.Close()
	}
	if c.Topo != nil {
		errs = append(errs, c.Topo.Close())
	}
	if c.sysctls != nil {
		restored, err := c.sysctls.restore()
		if len(restored) > 0 {
			c.logf("restored sysctls kubelet changed: %s", strings.Join(restored, ", "))
		}
		errs = append(errs, err)
	}
	if c.Dir != "" && os.Getenv("NFTPROXY_CONFORMANCE_KEEP") == "" {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	if c.lock != nil {
		c.lock.Close()
	}
	return errors.Join(errs...)
}

// sourceDir is this package's directory, where node.sh and coredns.yaml are.
func sourceDir() string {
	wd, _ := os.Getwd()
	return wd
}

func ptr[T any](v T) *T { return &v }

type permanentError struct{ error }

func permanent(err error) error { return permanentError{err} }

// retry calls fn until it returns nil, a permanent error, or limit passes.
func retry(ctx context.Context, limit time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		var p permanentError
		if errors.As(err, &p) {
			return p.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", limit, err)
		case <-time.After(time.Second):
		}
	}
}

func runOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// ProxyLogs is every node's proxy log.
func (c *Cluster) ProxyLogs() string {
	var b strings.Builder
	for i, d := range c.proxies {
		fmt.Fprintf(&b, "=== %s on %s\n%s\n", c.opts.Proxy.Name, c.Topo.Nodes[i].Name, d.Log())
	}
	return b.String()
}
