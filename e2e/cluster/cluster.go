package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Identity is who the daemons are to the API server: the ServiceAccount of
// deploy/, with only the permissions deploy/rbac.yaml grants.
const Identity = "system:serviceaccount:kube-system:nftproxy"

// ClusterCIDR holds every node's pod CIDR.
const ClusterCIDR = "10.244.0.0/16"

// APIPort is where the relay in the fabric listens for the nodes.
const APIPort = 6443

// HealthzPort is the daemons' /healthz port, on every address of the node.
const HealthzPort = 10256

// Options choose the cluster's shape.
type Options struct {
	// Binary is the nftproxy binary the nodes run (required).
	Binary string
	// Nodes is the number of nodes; 0 means 3.
	Nodes int
	// PodsPerNode; 0 means 2.
	PodsPerNode int
	// Zones are the nodes' topology.kubernetes.io/zone labels, in turn;
	// empty means zone-a, zone-b, zone-c.
	Zones []string
	// Prefix starts the namespace names; default "npk".
	Prefix string
	// DeployDir holds deploy/'s serviceaccount.yaml and rbac.yaml; empty
	// means the repository's, found from this source file's path.
	DeployDir string
	// DaemonArgs are added to every daemon's flags.
	DaemonArgs []string
	// Dir receives the kubeconfigs; empty means a temporary directory that
	// Close removes.
	Dir string
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
}

// Cluster is a running cluster: API server, topology, Node objects and one
// nftproxy per node.
type Cluster struct {
	Topo *netns.ClusterTopology
	API  *apiserver.Server
	// Client is an admin client of the API server.
	Client kubernetes.Interface
	// Kubeconfig is the admin kubeconfig (on 127.0.0.1 of the host
	// namespace), for kubectl.
	Kubeconfig string
	// NodeKubeconfig is the daemons' kubeconfig: through the relay in the
	// fabric, as the ServiceAccount of deploy/.
	NodeKubeconfig string

	opts      Options
	dir       string
	removeDir bool
	relay     *netns.Relay

	mu      sync.Mutex
	daemons map[string]*e2e.Daemon
	lbs     []*LoadBalancer
}

// Start builds everything and returns once every daemon has synced. On
// error, everything made so far is removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Binary == "" {
		return nil, errors.New("start cluster: no nftproxy binary")
	}
	if len(opts.Zones) == 0 {
		opts.Zones = []string{"zone-a", "zone-b", "zone-c"}
	}
	c := &Cluster{opts: opts, dir: opts.Dir, daemons: map[string]*e2e.Daemon{}}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("start cluster: %w", err), c.Close())
		}
	}()
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "nftproxy-cluster-"); err != nil {
			return c, err
		}
		c.removeDir = true
	}
	c.logf("starting etcd and kube-apiserver")
	if c.API, err = apiserver.Start(ctx, apiserver.Options{}); err != nil {
		return c, err
	}
	c.Kubeconfig = c.API.Kubeconfig
	cfg := rest.CopyConfig(c.API.RestConfig)
	cfg.WarningHandler = rest.NoWarnings{}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return c, err
	}
	c.logf("building %d nodes of %d pods in network namespaces", max(opts.Nodes, 3), max(opts.PodsPerNode, 2))
	if c.Topo, err = netns.BuildCluster(netns.ClusterOptions{Prefix: opts.Prefix, Nodes: opts.Nodes, PodsPerNode: opts.PodsPerNode}); err != nil {
		return c, err
	}
	api, err := url.Parse(c.API.URL)
	if err != nil {
		return c, fmt.Errorf("parse API server URL: %w", err)
	}
	if c.relay, err = netns.StartRelay(c.Topo.Fabric, netip.AddrPortFrom(netns.FabricAddr, APIPort).String(), api.Host); err != nil {
		return c, err
	}
	if c.NodeKubeconfig, err = c.writeNodeKubeconfig(); err != nil {
		return c, err
	}
	if err := c.waitSystemNamespace(ctx); err != nil {
		return c, err
	}
	deploy := opts.DeployDir
	if deploy == "" {
		deploy = filepath.Join(e2e.RepoRoot(), "deploy")
	}
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		if err := c.Apply(ctx, filepath.Join(deploy, f)); err != nil {
			return c, err
		}
	}
	for _, n := range c.Topo.Nodes {
		if err := c.CreateNode(ctx, n); err != nil {
			return c, err
		}
	}
	for _, n := range c.Topo.Nodes {
		if err := c.StartDaemon(n.Name); err != nil {
			return c, err
		}
	}
	for _, n := range c.Topo.Nodes {
		if err := c.Daemon(n.Name).WaitSynced(ctx, 1); err != nil {
			return c, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	c.logf("every node synced")
	return c, nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

// waitSystemNamespace waits for kube-system, which kube-apiserver creates
// shortly after it is ready.
func (c *Cluster) waitSystemNamespace(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for namespace kube-system: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeNodeKubeconfig writes the daemons' kubeconfig: the admin's
// credentials acting as Identity, through the relay. The serving
// certificate names 127.0.0.1, which the client checks instead of the
// relay's address.
func (c *Cluster) writeNodeKubeconfig() (string, error) {
	path := filepath.Join(c.dir, "node-kubeconfig")
	return path, apiserver.RelayedKubeconfig(c.API.Kubeconfig, netip.AddrPortFrom(netns.FabricAddr, APIPort).String(), Identity, path)
}

// NodeObject is the Node object of a topology node: its address, pod CIDR,
// zone and hostname labels.
func (c *Cluster) NodeObject(n *netns.ClusterNode) *v1.Node {
	zone := c.opts.Zones[(n.Index-1)%len(c.opts.Zones)]
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
			v1.LabelTopologyZone: zone,
			v1.LabelHostname:     n.Name,
			v1.LabelOSStable:     "linux",
		}},
		Spec: v1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		Status: v1.NodeStatus{
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: n.Addr.String()}, {Type: v1.NodeHostName, Address: n.Name}},
			// No kubelet: kubectl shows Ready instead of Unknown.
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "NetnsNode",
				Message: "a network namespace; no kubelet", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
}

// Zone is the zone label of node n.
func (c *Cluster) Zone(n *netns.ClusterNode) string {
	return c.NodeObject(n).Labels[v1.LabelTopologyZone]
}

// CreateNode creates n's Node object with its status.
func (c *Cluster) CreateNode(ctx context.Context, n *netns.ClusterNode) error {
	want := c.NodeObject(n)
	node, err := c.Client.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	node.Status = want.Status
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set status of node %s: %w", n.Name, err)
	}
	return nil
}

// DaemonArgs are the flags node n's daemon runs with.
func (c *Cluster) DaemonArgs(n *netns.ClusterNode) []string {
	return append([]string{"--kubeconfig", c.NodeKubeconfig, "--hostname-override", n.Name,
		"--cluster-cidr", ClusterCIDR, "--min-sync-period", "100ms",
		"--healthz-bind-address", "0.0.0.0:" + strconv.Itoa(HealthzPort),
		"--metrics-bind-address", "127.0.0.1:10249", "-v", "2"}, c.opts.DaemonArgs...)
}

// StartDaemon starts nftproxy on the named node; it does not wait for a sync.
func (c *Cluster) StartDaemon(node string) error {
	n := c.Topo.Node(node)
	if n == nil {
		return fmt.Errorf("start nftproxy: no node %s", node)
	}
	d, err := e2e.Start(n.NS, c.opts.Binary, c.DaemonArgs(n)...)
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	c.mu.Lock()
	c.daemons[node] = d
	c.mu.Unlock()
	return nil
}

// Daemon returns the named node's current daemon.
func (c *Cluster) Daemon(node string) *e2e.Daemon {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.daemons[node]
}

// RestartDaemon stops the named node's nftproxy (SIGTERM, which leaves its
// rules in place), starts a new one and waits for its first sync.
func (c *Cluster) RestartDaemon(ctx context.Context, node string) error {
	if d := c.Daemon(node); d != nil {
		if err := d.Stop(); err != nil {
			return err
		}
	}
	if err := c.StartDaemon(node); err != nil {
		return err
	}
	return c.Daemon(node).WaitSynced(ctx, 1)
}

// Logs returns every daemon's log, node by node.
func (c *Cluster) Logs() string {
	var b bytes.Buffer
	for _, n := range c.Topo.Nodes {
		if d := c.Daemon(n.Name); d != nil {
			fmt.Fprintf(&b, "=== nftproxy on %s\n%s\n", n.Name, d.Log())
		}
	}
	return b.String()
}

// Close stops the load balancers, the daemons, the relay, the API server,
// and deletes every namespace and the directory it made. Safe on a partly
// started cluster.
func (c *Cluster) Close() error {
	var errs []error
	c.mu.Lock()
	lbs, daemons := c.lbs, c.daemons
	c.lbs, c.daemons = nil, map[string]*e2e.Daemon{}
	c.mu.Unlock()
	for _, lb := range lbs {
		lb.Close()
	}
	for _, d := range daemons {
		if err := d.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.relay != nil {
		c.relay.Close()
	}
	if c.Topo != nil {
		errs = append(errs, c.Topo.Close())
	}
	if c.API != nil {
		c.API.Stop()
	}
	if c.removeDir && c.dir != "" {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}

// Apply creates the objects of a YAML file: ServiceAccounts, RBAC, Services,
// EndpointSlices (Nodes are the cluster's own and are skipped). Objects that
// exist are left alone.
func (c *Cluster) Apply(ctx context.Context, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("decode %s: %w", path, err)
		}
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			_, err = c.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.Client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *v1.Service:
			_, err = c.Client.CoreV1().Services(namespaceOf(o.Namespace)).Create(ctx, o, metav1.CreateOptions{})
		case *discoveryv1.EndpointSlice:
			_, err = c.Client.DiscoveryV1().EndpointSlices(namespaceOf(o.Namespace)).Create(ctx, o, metav1.CreateOptions{})
		case *v1.Node:
			continue
		default:
			return fmt.Errorf("apply %s: unexpected %T", path, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T from %s: %w", obj, path, err)
		}
	}
}

func namespaceOf(ns string) string {
	if ns == "" {
		return metav1.NamespaceDefault
	}
	return ns
}
