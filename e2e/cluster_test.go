package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// The scenarios below run nftproxy against a real kube-apiserver: objects
// written with client-go drive the daemon, packets in the namespace topology
// prove what it did. One API server serves them all; each scenario has its
// own Kubernetes namespace, ClusterIPs, NodePort, topology and daemon, and
// deletes its objects when it ends.

// clusterIdentity is who the daemon is to the API server: the ServiceAccount
// of deploy/, with only the permissions deploy/rbac.yaml grants.
const clusterIdentity = "system:serviceaccount:kube-system:nftproxy"

// clusterNode is the Node object of the topology's node namespace.
const clusterNode = "node-1"

// clusterEnv is the API server the scenarios share.
type clusterEnv struct {
	srv    *apiserver.Server
	client kubernetes.Interface
}

func TestAPIServer(t *testing.T) {
	if binary == "" {
		netns.Require(t) // skips in -short mode before probing
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	start := time.Now()
	env := newClusterEnv(t)
	t.Logf("API server and cluster objects ready in %s", time.Since(start).Round(time.Millisecond))
	tests := []struct {
		name string
		run  func(*testing.T, *clusterEnv)
	}{
		{"ClusterIPFollowsSlices", testClusterIPFollowsSlices},
		{"NodePortMergesSlices", testClusterNodePortMergesSlices},
		{"APIServerOutage", testClusterAPIServerOutage},
		{"Partition", testClusterPartition},
		{"DaemonRestart", testClusterDaemonRestart},
		{"RestartWhileAPIServerDown", testClusterRestartWhileAPIServerDown},
		{"MetricsAndHealth", testClusterMetricsAndHealth},
		{"NetworkProgrammingIgnoresResyncs", testClusterNetworkProgrammingIgnoresResyncs},
		{"MetricsAsKubeProxy", testClusterMetricsAsKubeProxy},
		{"DriftRepair", testClusterDriftRepair},
		{"ServiceCIDRs", testClusterServiceCIDRs},
		// Last: it deletes and recreates the Node.
		{"NodeDrainHealthz", testClusterNodeDrainHealthz},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			tt.run(t, env)
			t.Logf("took %s", time.Since(start).Round(time.Millisecond))
		})
	}
}

// newClusterEnv starts the API server and writes what every scenario needs:
// the Node and deploy/'s ServiceAccount and RBAC.
func newClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	srv := apiserver.Require(t)
	cfg := rest.CopyConfig(srv.RestConfig)
	cfg.WarningHandler = rest.NoWarnings{} // externalIPs are deprecated, and used on purpose
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env := &clusterEnv{srv: srv, client: client}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// kube-apiserver creates kube-system itself, shortly after it is ready.
	clusterEventually(ctx, t, "namespace kube-system", func() error {
		_, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
		return err
	})
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml"} {
		env.createManifests(ctx, t, filepath.Join("..", "deploy", f))
	}

	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: clusterNode, Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
	node, err = client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: netns.NodeAddr.String()}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set node addresses: %v", err)
	}

	// The daemon's identity reads what it needs and nothing more.
	cfg = rest.CopyConfig(srv.RestConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: clusterIdentity}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("%s cannot list EndpointSlices: %v", clusterIdentity, err)
	}
	if _, err := as.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("%s listing Secrets: error %v, want forbidden", clusterIdentity, err)
	}
	return env
}

// createManifests creates the ServiceAccounts and RBAC objects of a file.
func (env *clusterEnv) createManifests(ctx context.Context, t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode %s: %v", path, err)
		}
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			_, err = env.client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = env.client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = env.client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", path, obj)
		}
		if err != nil {
			t.Fatalf("create %T from %s: %v", obj, path, err)
		}
	}
}

// clusterEventually polls f until it returns nil, failing t with f's last
// error when ctx ends.
func clusterEventually(ctx context.Context, t *testing.T, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %s: %v", what, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// clusterScenario is a topology whose node namespace runs nftproxy against
// the shared API server.
type clusterScenario struct {
	t          *testing.T
	env        *clusterEnv
	ns         string // Kubernetes namespace of the scenario's objects
	topo       *netns.Topology
	relay      *netns.Relay
	kubeconfig string
	args       []string
	daemonEnv  []string // nftproxy's environment; nil: the test's
	d          *Daemon
	ctx        context.Context
}

// newClusterScenario makes namespace ns in the API server, builds a topology
// of three pods serving their names on tcp/8080, and starts nftproxy in its
// node namespace, waiting for the first sync.
func newClusterScenario(t *testing.T, env *clusterEnv, ns string, args ...string) *clusterScenario {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	s := &clusterScenario{t: t, env: env, ns: ns, ctx: ctx}
	s.setUp("e2k", 3)
	s.args = append([]string{"--kubeconfig", s.kubeconfig, "--hostname-override", clusterNode,
		"--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
		"--min-sync-period", "100ms", "-v", "2"}, args...)
	s.startDaemon()
	return s
}

// setUp makes the scenario's namespace in the API server, deleting its
// objects when the test ends, builds a topology of pods pods serving their
// names on tcp/8080, and relays the node namespace to the API server.
func (s *clusterScenario) setUp(prefix string, pods int) {
	t := s.t
	t.Helper()
	if _, err := s.env.client.CoreV1().Namespaces().Create(s.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", s.ns, err)
	}
	// Registered before the daemon's cleanup, so it runs after the daemon
	// stopped: later scenarios start from a cluster without these objects.
	t.Cleanup(s.deleteAll)

	s.topo = netns.NewTopology(t, netns.TopologyOptions{Prefix: prefix, Pods: pods})
	for _, p := range s.topo.Pods {
		if _, err := p.ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
	}
	s.relay, s.kubeconfig = relayToAPIServer(t, s.env, s.topo.Node)
}

// startDaemon starts nftproxy with the scenario's flags (stopping it when
// the test ends) and waits for its first sync.
func (s *clusterScenario) startDaemon() {
	s.t.Helper()
	d := startUntilCleanup(s.t, s.topo.Node, s.daemonEnv, s.args...)
	s.d = d
	if err := d.WaitSynced(s.ctx, 1); err != nil {
		s.t.Fatal(err)
	}
}

// relayToAPIServer relays 127.0.0.1 in ns to the test's API server and
// writes a kubeconfig through it, acting as the daemon's ServiceAccount.
func relayToAPIServer(t *testing.T, env *clusterEnv, ns *netns.NS) (*netns.Relay, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	r, err := env.srv.Relay(ns, clusterIdentity, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, path
}

// deleteAll deletes the scenario's Services and EndpointSlices. Without a
// namespace controller the namespace itself would never go away, so it stays.
func (s *clusterScenario) deleteAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := apiserver.DeleteServicesAndSlices(ctx, s.env.client, s.ns); err != nil {
		s.t.Error(err)
	}
}

// service creates a TCP Service with port p → 8080 on clusterIP, of type
// NodePort when nodePort is not 0.
func (s *clusterScenario) service(name, clusterIP string, nodePort int32, mods ...func(*v1.Service)) {
	s.t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080), NodePort: nodePort}},
		},
	}
	if nodePort != 0 {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	for _, m := range mods {
		m(svc)
	}
	if _, err := s.env.client.CoreV1().Services(s.ns).Create(s.ctx, svc, metav1.CreateOptions{}); err != nil {
		s.t.Fatalf("create service %s: %v", name, err)
	}
}

// slice creates or replaces EndpointSlice name of service with ready
// endpoints on this node at the given addresses, port 8080.
func (s *clusterScenario) slice(service, name string, addrs ...netip.Addr) {
	s.t.Helper()
	s.sliceWith(service, name, nil, addrs...)
}

// sliceWith is slice with the given annotations.
func (s *clusterScenario) sliceWith(service, name string, annotations map[string]string, addrs ...netip.Addr) {
	s.t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Annotations: annotations, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			// Not the controller's value: nothing else manages these slices.
			discoveryv1.LabelManagedBy: "e2e",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(clusterNode)})
	}
	client := s.env.client.DiscoveryV1().EndpointSlices(s.ns)
	old, err := client.Get(s.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = client.Create(s.ctx, es, metav1.CreateOptions{})
	case err == nil:
		es.ResourceVersion = old.ResourceVersion
		_, err = client.Update(s.ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		s.t.Fatalf("write endpoint slice %s: %v", name, err)
	}
}

// pods returns the addresses and names of the topology's pods i...
func (s *clusterScenario) pods(i ...int) ([]netip.Addr, []string) {
	var addrs []netip.Addr
	var names []string
	for _, n := range i {
		addrs = append(addrs, s.topo.Pods[n].Addr)
		names = append(names, s.topo.Pods[n].Name)
	}
	return addrs, names
}

// webWithSession serves "web" at vip (and nodePort unless 0) by pods 0 and
// 1, waits until both answer and opens a TCP session to vip; the caller
// closes it. It returns the pods' names and the session.
func (s *clusterScenario) webWithSession(vip netip.AddrPort, nodePort uint16) ([]string, *netns.TCPSession) {
	s.t.Helper()
	s.service("web", vip.Addr().String(), int32(nodePort))
	a01, n01 := s.pods(0, 1)
	s.slice("web", "web-a", a01...)
	s.eventually("service", func() error { return s.answeredBy(vip, n01) })
	sess, err := s.topo.Client.ConnectTCP(s.ctx, netip.AddrPort{}, vip)
	if err != nil {
		s.t.Fatal(err)
	}
	return n01, sess
}

// answeredBy asks addr from the client namespace several times per wanted
// name and reports unless every answer came from a wanted pod and every
// wanted pod answered.
func (s *clusterScenario) answeredBy(addr netip.AddrPort, want []string) error {
	got := map[string]int{}
	for range 8 * len(want) {
		name, err := s.topo.Client.AskTCP(s.ctx, addr)
		if err != nil {
			return fmt.Errorf("ask %s: %w", addr, err)
		}
		got[name]++
	}
	if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, slices.Sorted(slices.Values(want))) {
		return fmt.Errorf("%s answered by %v, want %v", addr, got, want)
	}
	return nil
}

// eventually waits up to 15 s for f to return nil and returns how long it took.
func (s *clusterScenario) eventually(what string, f func() error) time.Duration {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, 15*time.Second)
	defer cancel()
	return clusterEventually(ctx, s.t, what, f)
}

// ruleset lists every table of the node namespace with nft.
func (s *clusterScenario) ruleset() string {
	s.t.Helper()
	out, err := s.topo.Node.Exec("nft", "list", "ruleset")
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// dropped asks addr with a short deadline and reports unless the packets
// went nowhere: the ClusterIP of a deleted service is an unallocated address
// of the cluster's ServiceCIDR, which nftproxy drops as kube-proxy does.
func (s *clusterScenario) dropped(addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(s.ctx, 700*time.Millisecond)
	defer cancel()
	name, err := s.topo.Client.AskTCP(ctx, addr)
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Errorf("%s answered by %s, want a drop", addr, name)
	case !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()):
		return fmt.Errorf("ask %s: %v, want a timeout (dropped)", addr, err)
	}
	return nil
}

// clusterRefused reports whether err is a connection refused or an ICMP
// unreachable: an answer that comes at once, not a silent drop.
func clusterRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// get fetches url from inside the node namespace, where the daemon's
// health and metrics servers listen on loopback.
func (s *clusterScenario) get(url string) (int, []byte, error) {
	return s.topo.Node.Get(s.ctx, url)
}

// healthy checks /healthz: 200, healthy and nodeEligible in kube-proxy's
// JSON body.
func (s *clusterScenario) healthy() error {
	code, h, err := s.healthz("/healthz")
	if err != nil {
		return err
	}
	if code != http.StatusOK || !h.Healthy || h.NodeEligible == nil || !*h.NodeEligible {
		return fmt.Errorf("/healthz: %d %+v", code, h)
	}
	return nil
}

// clusterHealth is kube-proxy's /healthz and /livez body.
type clusterHealth struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible"`
	Healthy      bool      `json:"healthy"`
}

// healthz fetches /healthz or /livez and decodes the body.
func (s *clusterScenario) healthz(path string) (int, clusterHealth, error) {
	var h clusterHealth
	code, body, err := s.get("http://127.0.0.1:10256" + path)
	if err != nil {
		return 0, h, err
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return code, h, fmt.Errorf("decode %s body %q: %w", path, body, err)
	}
	return code, h, nil
}

func testClusterIPFollowsSlices(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-slices")
	vip := netip.MustParseAddrPort("10.96.20.10:80")
	before := s.ruleset()

	a0, n0 := s.pods(0)
	s.service("web", vip.Addr().String(), 0)
	s.slice("web", "web-a", a0...)
	took := s.eventually("service created", func() error { return s.answeredBy(vip, n0) })
	t.Logf("Service and EndpointSlice created: traffic through the ClusterIP after %s", took.Round(time.Millisecond))

	a12, n12 := s.pods(1, 2)
	s.slice("web", "web-a", a12...)
	took = s.eventually("slice changed", func() error { return s.answeredBy(vip, n12) })
	t.Logf("slice changed: traffic moved after %s", took.Round(time.Millisecond))

	// A second slice of the same service adds its endpoints to the first's.
	_, all := s.pods(0, 1, 2)
	s.slice("web", "web-b", a0...)
	s.eventually("second slice", func() error { return s.answeredBy(vip, all) })

	if err := env.client.CoreV1().Services(s.ns).Delete(s.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = s.eventually("service deleted", func() error { return s.dropped(vip) })
	t.Logf("Service deleted: ClusterIP dropped (an unallocated address of the ServiceCIDR) after %s", took.Round(time.Millisecond))
	// Its slices are still there (no garbage collector runs), but nothing of
	// the service is left in the tables: they are as before it existed.
	s.eventually("tables as before the service", func() error {
		if diff := cmp.Diff(before, s.ruleset()); diff != "" {
			return fmt.Errorf("ruleset (-before +now):\n%s", diff)
		}
		return nil
	})
}

func testClusterNodePortMergesSlices(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-nodeport")
	vip := netip.MustParseAddrPort("10.96.21.10:80")
	np := netip.AddrPortFrom(netns.NodeAddr, 30210)
	s.service("web", vip.Addr().String(), int32(np.Port()))
	a0, n0 := s.pods(0)
	a1, _ := s.pods(1)
	s.slice("web", "web-a", a0...)
	s.slice("web", "web-b", a1...)
	_, both := s.pods(0, 1)
	s.eventually("NodePort on the node address, both slices", func() error { return s.answeredBy(np, both) })
	if err := s.answeredBy(vip, both); err != nil {
		t.Error(err)
	}
	if err := env.client.DiscoveryV1().EndpointSlices(s.ns).Delete(s.ctx, "web-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually("one slice deleted", func() error { return s.answeredBy(np, n0) })
}

func testClusterAPIServerOutage(t *testing.T, env *clusterEnv) {
	const outage = 10 * time.Second
	s := newClusterScenario(t, env, "e2e-outage")
	vip := netip.MustParseAddrPort("10.96.22.10:80")
	np := netip.AddrPortFrom(netns.NodeAddr, 30220)
	n01, sess := s.webWithSession(vip, np.Port())
	defer sess.Close()

	env.srv.StopAPIServer()
	down := time.Now()
	running := false
	t.Cleanup(func() {
		if !running { // leave the server up for the scenarios after this one
			if err := env.srv.StartAPIServer(context.Background()); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	rounds := 0
	for i := 0; time.Since(down) < outage; i++ {
		line := fmt.Sprintf("ping %d", i)
		if got, err := sess.Echo(s.ctx, line); err != nil || got != line {
			t.Fatalf("established connection %s after %s without API server: %q, %v", sess.Name, time.Since(down), got, err)
		}
		for _, addr := range []netip.AddrPort{vip, np} {
			if name, err := s.topo.Client.AskTCP(s.ctx, addr); err != nil || !slices.Contains(n01, name) {
				t.Fatalf("new connection to %s after %s without API server: %q, %v", addr, time.Since(down), name, err)
			}
		}
		if err := s.healthy(); err != nil {
			t.Errorf("after %s without API server: %v", time.Since(down), err)
		}
		rounds++
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-s.d.done:
		t.Fatalf("nftproxy exited while the API server was down:\n%s", s.d.Log())
	default:
	}
	t.Logf("API server down %s: %d rounds of echo, new ClusterIP and NodePort connections and /healthz all answered",
		time.Since(down).Round(time.Millisecond), rounds)

	if err := env.srv.StartAPIServer(s.ctx); err != nil {
		t.Fatal(err)
	}
	running = true
	back := time.Now()
	a2, n2 := s.pods(2)
	s.slice("web", "web-a", a2...)
	ctx, cancel := context.WithTimeout(s.ctx, 45*time.Second) // client-go backs off up to ~30 s
	defer cancel()
	clusterEventually(ctx, t, "change after the API server returned", func() error { return s.answeredBy(vip, n2) })
	t.Logf("API server back after %s; a change written then was in the kernel %s later",
		back.Sub(down).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	if err := s.healthy(); err != nil {
		t.Error(err)
	}
}

// testClusterPartition cuts the node off an API server that keeps running
// and taking changes: the daemon keeps the last rules, and applies every
// change it missed (an endpoint moved, a service deleted, one created) once
// it reaches the server again.
func testClusterPartition(t *testing.T, env *clusterEnv) {
	const partition = 3 * time.Second
	s := newClusterScenario(t, env, "e2e-partition")
	web := netip.MustParseAddrPort("10.96.29.10:80")
	gone := netip.MustParseAddrPort("10.96.29.11:80")
	late := netip.MustParseAddrPort("10.96.29.12:80")
	a01, n01 := s.pods(0, 1)
	a1, n1 := s.pods(1)
	a2, n2 := s.pods(2)
	s.service("web", web.Addr().String(), 0)
	s.slice("web", "web-a", a01...)
	s.service("gone", gone.Addr().String(), 0)
	s.slice("gone", "gone-a", a2...)
	s.eventually("services", func() error { return errors.Join(s.answeredBy(web, n01), s.answeredBy(gone, n2)) })

	s.relay.SetCut(true)
	cut := time.Now()
	s.slice("web", "web-a", a2...)
	if err := env.client.CoreV1().Services(s.ns).Delete(s.ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.service("late", late.Addr().String(), 0)
	s.slice("late", "late-a", a1...)
	time.Sleep(partition - time.Since(cut))
	if err := errors.Join(s.answeredBy(web, n01), s.answeredBy(gone, n2)); err != nil {
		t.Errorf("cut off the API server, the last rules must stay: %v", err)
	}

	s.relay.SetCut(false)
	back := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, 45*time.Second) // client-go backs off up to ~30 s
	defer cancel()
	clusterEventually(ctx, t, "changes missed during the partition", func() error {
		return errors.Join(s.dropped(gone), s.answeredBy(web, n2), s.answeredBy(late, n1))
	})
	t.Logf("partitioned %s; every missed change applied %s after it ended",
		back.Sub(cut).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}

func testClusterDaemonRestart(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-restart")
	vip := netip.MustParseAddrPort("10.96.23.10:80")
	np := netip.AddrPortFrom(netns.NodeAddr, 30230)
	n01, sess := s.webWithSession(vip, np.Port())
	defer sess.Close()
	echo := func(when string) {
		t.Helper()
		if got, err := sess.Echo(s.ctx, when); err != nil || got != when {
			t.Fatalf("connection to %s %s: %q, %v", sess.Name, when, got, err)
		}
	}
	echo("before")
	before := s.ruleset()

	s.d.Kill()
	echo("while nftproxy is dead")
	if err := s.answeredBy(vip, n01); err != nil {
		t.Errorf("while nftproxy is dead: %v", err)
	}
	s.startDaemon()
	echo("after the restart")
	if !clusterFirstSyncFull(s.d) {
		t.Errorf("the restarted daemon's first sync was not full:\n%s", s.d.Log())
	}
	if diff := cmp.Diff(before, s.ruleset()); diff != "" {
		t.Errorf("the restart's full sync changed the ruleset (-before +after):\n%s", diff)
	}
	if err := s.answeredBy(np, n01); err != nil {
		t.Error(err)
	}
}

// clusterFirstSyncFull reports whether the daemon's first logged sync was a
// full one.
func clusterFirstSyncFull(d *Daemon) bool {
	sc := bufio.NewScanner(strings.NewReader(d.Log()))
	for sc.Scan() {
		var line struct {
			Msg  string `json:"msg"`
			Full bool   `json:"full"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "Synced" {
			return line.Full
		}
	}
	return false
}

// testClusterRestartWhileAPIServerDown restarts the daemon while it cannot
// reach the API server: it must apply nothing (an empty first sync would
// remove every service) until its informers have listed everything, then
// sync to the same ruleset.
func testClusterRestartWhileAPIServerDown(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-restart-down")
	vip := netip.MustParseAddrPort("10.96.27.10:80")
	n01, sess := s.webWithSession(vip, 0)
	defer sess.Close()
	before := s.ruleset()

	s.d.Kill()
	env.srv.StopAPIServer()
	running := false
	t.Cleanup(func() {
		if !running {
			if err := env.srv.StartAPIServer(context.Background()); err != nil {
				t.Errorf("restart kube-apiserver: %v", err)
			}
		}
	})
	// A daemon stopped before it could sync exits cleanly and leaves the rules.
	d, err := StartWithEnv(s.topo.Node, s.daemonEnv, binary, s.args...)
	if err != nil {
		t.Fatal(err)
	}
	// Signal it only once it waits for the informers: a loaded machine can
	// take longer than any fixed pause to start it.
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(d.Log(), "Waiting for informers to sync"); {
		if time.Now().After(deadline) {
			t.Fatalf("nftproxy did not start waiting for the API server:\n%s", d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if err := d.Stop(); err != nil || !d.cmd.ProcessState.Success() {
		t.Errorf("SIGTERM while waiting for the API server: %v, %v:\n%s", err, d.cmd.ProcessState, d.Log())
	}

	d = startUntilCleanup(t, s.topo.Node, nil, s.args...)
	s.d = d
	time.Sleep(time.Second) // long enough to have applied something if it were going to
	if n := d.Syncs(); n != 0 {
		t.Errorf("synced %d times without an API server", n)
	}
	if diff := cmp.Diff(before, s.ruleset()); diff != "" {
		t.Errorf("ruleset changed before the informers synced (-before +now):\n%s", diff)
	}
	if err := s.answeredBy(vip, n01); err != nil {
		t.Errorf("while the new daemon waits for the API server: %v", err)
	}

	if err := env.srv.StartAPIServer(s.ctx); err != nil {
		t.Fatal(err)
	}
	running = true
	if err := d.WaitSynced(s.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, s.ruleset()); diff != "" {
		t.Errorf("the first sync after the API server returned changed the ruleset (-before +after):\n%s", diff)
	}
	if got, err := sess.Echo(s.ctx, "after"); err != nil || got != "after" {
		t.Errorf("connection to %s across the restart: %q, %v", sess.Name, got, err)
	}
}

func testClusterMetricsAndHealth(t *testing.T, env *clusterEnv) {
	started := time.Now()
	s := newClusterScenario(t, env, "e2e-metrics", "--profiling")
	vip := netip.MustParseAddrPort("10.96.24.10:80")
	s.service("web", vip.Addr().String(), 0)
	a0, n0 := s.pods(0)
	s.slice("web", "web-a", a0...)
	s.eventually("service", func() error { return s.answeredBy(vip, n0) })
	// A newer service claiming web's address and port as an external IP:
	// the API server takes it, nftproxy must leave its port out. Creation
	// timestamps have whole seconds and equally old services are ordered by
	// name, so the name sorts after web's too.
	s.service("zz-thief", "10.96.24.11", 0, func(svc *v1.Service) { svc.Spec.ExternalIPs = []string{vip.Addr().String()} })

	// kube-proxy's network programming latency runs from the slice's
	// last-change-trigger-time, which the endpoint slice controller sets
	// when it sees the change: here 2 s before the slice is written, so the
	// figure can't be the change's arrival at nftproxy.
	triggered := time.Now()
	time.Sleep(2 * time.Second)
	a1, n1 := s.pods(1)
	s.sliceWith("web", "web-a", map[string]string{v1.EndpointsLastChangeTriggerTime: triggered.UTC().Format(time.RFC3339Nano)}, a1...)
	s.eventually("endpoint change", func() error { return s.answeredBy(vip, n1) })

	type check struct {
		name   string
		labels []string // the series checked; none: the only one
		ok     func(m *dto.Metric) error
	}
	atLeast := func(min float64) func(*dto.Metric) error {
		return func(m *dto.Metric) error {
			if v := m.GetCounter().GetValue(); v < min {
				return fmt.Errorf("%v, want at least %v", v, min)
			}
			return nil
		}
	}
	gauge := func(min, max float64) func(*dto.Metric) error {
		return func(m *dto.Metric) error {
			if v := m.GetGauge().GetValue(); v < min || v > max {
				return fmt.Errorf("%v, want %v..%v", v, min, max)
			}
			return nil
		}
	}
	histogram := func(minCount uint64, maxMean float64) func(*dto.Metric) error {
		return func(m *dto.Metric) error {
			h := m.GetHistogram()
			if h.GetSampleCount() < minCount || h.GetSampleSum() <= 0 || h.GetSampleSum()/float64(h.GetSampleCount()) > maxMean {
				return fmt.Errorf("%d observations summing to %v, want at least %d with a mean in (0, %v]",
					h.GetSampleCount(), h.GetSampleSum(), minCount, maxMean)
			}
			return nil
		}
	}
	timestamp := func(m *dto.Metric) error {
		ts := time.Unix(0, int64(m.GetGauge().GetValue()*1e9))
		if ts.Before(started) || ts.After(time.Now()) {
			return fmt.Errorf("%s, want between the daemon's start %s and now", ts, started)
		}
		return nil
	}
	zero := func(m *dto.Metric) error {
		if v := m.GetCounter().GetValue(); v != 0 {
			return fmt.Errorf("%v, want 0", v)
		}
		return nil
	}
	ipv4, ipv6 := []string{"ip_family", "IPv4"}, []string{"ip_family", "IPv6"}
	checks := []check{
		// Three syncs at least: the first, web's and the endpoint change;
		// each well under a second here. Both families count each, with
		// their own table's share.
		{"kubeproxy_sync_proxy_rules_duration_seconds", ipv4, histogram(3, 1)},
		{"kubeproxy_sync_proxy_rules_duration_seconds", ipv6, histogram(3, 1)},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", ipv4, histogram(1, 1)},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", ipv4, histogram(2, 1)},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", ipv4, timestamp},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", ipv6, timestamp},
		{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", ipv4, timestamp},
		// Only the annotated change counts: from its trigger time, 2 s
		// before it was written, to the sync that applied it.
		{"kubeproxy_network_programming_duration_seconds", ipv4, func(m *dto.Metric) error {
			h := m.GetHistogram()
			if max := time.Since(triggered).Seconds(); h.GetSampleCount() != 1 || h.GetSampleSum() < 2 || h.GetSampleSum() > max {
				return fmt.Errorf("%d observations summing to %v s, want one of 2..%.1f s", h.GetSampleCount(), h.GetSampleSum(), max)
			}
			return nil
		}},
		// nftproxy's own figure runs from the arrival: each under the 2 s.
		{"nftproxy_network_programming_duration_seconds", nil, func(m *dto.Metric) error {
			h := m.GetHistogram()
			var under2s uint64
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() <= 2.048 {
					under2s = b.GetCumulativeCount()
				}
			}
			if h.GetSampleCount() < 3 || under2s != h.GetSampleCount() {
				return fmt.Errorf("%d observations, %d of them under 2.048 s, summing to %v s", h.GetSampleCount(), under2s, h.GetSampleSum())
			}
			return nil
		}},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", nil, gauge(0, 0)},
		{"kubeproxy_sync_proxy_rules_service_changes_pending", nil, gauge(0, 0)},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", nil, atLeast(2)},
		// The kubernetes Service and web.
		{"kubeproxy_sync_proxy_rules_service_changes_total", nil, atLeast(2)},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "internal", "ip_family", "IPv4"}, gauge(0, 0)},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", []string{"traffic_policy", "external", "ip_family", "IPv6"}, gauge(0, 0)},
		{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", ipv4, zero},
		{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", ipv6, zero},
		{"nftproxy_ct_state_invalid_dropped_packets_total", ipv4, zero},
		{"nftproxy_healthcheck_bind_failures_total", nil, zero},
		// client-go's, as Kubernetes components serve them: the informers'
		// requests (their lists may stream as watches, which end later).
		{"rest_client_requests_total", []string{"code", "200", "method", "GET"}, atLeast(1)},
		{"rest_client_request_duration_seconds", []string{"verb", "GET"}, histogram(1, 5)},
		{"rest_client_rate_limiter_duration_seconds", []string{"verb", "GET"}, func(m *dto.Metric) error {
			if m.GetHistogram().GetSampleCount() < 1 {
				return fmt.Errorf("%d observations", m.GetHistogram().GetSampleCount())
			}
			return nil
		}},
		{"kubernetes_build_info", []string{"git_version", "dev"}, gauge(1, 1)},
		{"nftproxy_sync_full_total", nil, atLeast(1)},
		{"nftproxy_sync_duration_seconds", nil, histogram(3, 1)},
		{"nftproxy_batch_messages", nil, func(m *dto.Metric) error {
			h := m.GetHistogram()
			if h.GetSampleCount() < 2 || h.GetSampleSum() < float64(h.GetSampleCount()) {
				return fmt.Errorf("%d batches of %v messages in all", h.GetSampleCount(), h.GetSampleSum())
			}
			return nil
		}},
		{"nftproxy_sync_failures_total", nil, zero},
		{"nftproxy_invalid_objects_total", []string{"kind", "Service"}, atLeast(1)},
	}
	var families map[string]*dto.MetricFamily
	s.eventually("metrics after the conflict", func() error {
		var err error
		if families, err = s.metrics(); err != nil {
			return err
		}
		if _, ok := families["nftproxy_invalid_objects_total"]; !ok {
			return errors.New("no nftproxy_invalid_objects_total yet")
		}
		return nil
	})
	for _, c := range checks {
		mf, ok := families[c.name]
		var series *dto.Metric
		switch {
		case !ok:
		case c.labels == nil && len(mf.GetMetric()) == 1:
			series = mf.GetMetric()[0]
		case c.labels != nil:
			series = prom.Series(mf, c.labels...)
		}
		if series == nil {
			t.Errorf("%s%v: not served: %v", c.name, c.labels, mf)
			continue
		}
		if err := c.ok(series); err != nil {
			t.Errorf("%s%v: %v", c.name, c.labels, err)
		}
	}
	// web keeps its address: the conflicting port was left out, not web's.
	if err := s.answeredBy(vip, n1); err != nil {
		t.Error(err)
	}
	if err := s.healthy(); err != nil {
		t.Error(err)
	}
	if code, body, err := s.get("http://127.0.0.1:10256/livez"); err != nil || code != http.StatusOK {
		t.Errorf("/livez: %d %s %v", code, body, err)
	}
	// --profiling serves Go's profiles beside the metrics.
	if code, body, err := s.get("http://127.0.0.1:10249/debug/pprof/heap?debug=1"); err != nil || code != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Errorf("/debug/pprof/heap: %d %.200s %v", code, body, err)
	}
}

// metrics scrapes the daemon's /metrics.
func (s *clusterScenario) metrics() (map[string]*dto.MetricFamily, error) {
	code, body, err := s.get("http://127.0.0.1:10249/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %d %s", code, body)
	}
	return prom.Parse(body)
}

// testClusterNetworkProgrammingIgnoresResyncs checks that the periodic full
// syncs, which apply no change, add nothing to the network programming
// latency: it measures how long changes take to reach the kernel.
func testClusterNetworkProgrammingIgnoresResyncs(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-netprog", "--sync-period", "1s")
	vip := netip.MustParseAddrPort("10.96.28.10:80")
	s.service("web", vip.Addr().String(), 0)
	a0, n0 := s.pods(0)
	s.slice("web", "web-a", a0...)
	s.eventually("service", func() error { return s.answeredBy(vip, n0) })
	programming := func() *dto.Histogram {
		t.Helper()
		families, err := s.metrics()
		if err != nil {
			t.Fatal(err)
		}
		// nftproxy's own figure: from a change's arrival.
		mf := families["nftproxy_network_programming_duration_seconds"]
		if mf == nil || len(mf.GetMetric()) != 1 {
			t.Fatalf("nftproxy_network_programming_duration_seconds: %v", mf)
		}
		return mf.GetMetric()[0].GetHistogram()
	}
	// A resync is a full sync, or one skipped because nothing committed.
	periodic := func() int { return s.d.Syncs() + s.d.ResyncsSkipped() }
	before, syncs := programming(), periodic()
	time.Sleep(3500 * time.Millisecond)
	skipped := s.d.ResyncsSkipped()
	after, resyncs := programming(), periodic()-syncs
	if resyncs < 2 {
		t.Fatalf("%d resyncs in 3.5 s with --sync-period 1s", resyncs)
	}
	// Nothing committed to nftables in the node's namespace meanwhile: the
	// resyncs had nothing to repair and were skipped.
	if skipped < 2 {
		t.Errorf("%d resyncs skipped in 3.5 s without a change; want them skipped while nothing commits", skipped)
	}
	if added := after.GetSampleSum() - before.GetSampleSum(); added > 0.5 {
		t.Errorf("%d resyncs without a change added %d observations, %.1f s in all, to the network programming latency",
			resyncs, after.GetSampleCount()-before.GetSampleCount(), added)
	}
}

func testClusterDriftRepair(t *testing.T, env *clusterEnv) {
	const period = 2 * time.Second
	parent := newClusterScenario(t, env, "e2e-drift", "--sync-period", period.String())
	vip := netip.MustParseAddrPort("10.96.25.10:80")
	np := netip.AddrPortFrom(netns.NodeAddr, 30250)
	parent.service("web", vip.Addr().String(), int32(np.Port()))
	a0, n0 := parent.pods(0)
	parent.slice("web", "web-a", a0...)
	parent.eventually("service", func() error { return parent.answeredBy(vip, n0) })
	// A repaired table holds the same chains and sets, but the kernel lists
	// the ones the repair recreated after those that stayed (and a recreated
	// table after the other family's): compare them in name order.
	want := clusterSortedBlocks(parent.ruleset())

	tests := []struct {
		name string
		nft  []string
		// broken is an address the tampering cuts off.
		broken netip.AddrPort
	}{
		{"flush the ClusterIP map", []string{"flush", "map", "ip", "nftproxy", "service-ips"}, vip},
		{"flush the NodePort map", []string{"flush", "map", "ip", "nftproxy", "service-nodeports"}, np},
		{"delete the prerouting NAT chain", []string{"delete", "chain", "ip", "nftproxy", "nat-prerouting"}, vip},
		{"flush the services chain", []string{"flush", "chain", "ip", "nftproxy", "services"}, np},
		{"delete the IPv4 table", []string{"delete", "table", "ip", "nftproxy"}, vip},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := *parent
			s.t = t
			syncs := s.d.Syncs()
			if _, err := s.topo.Node.Exec(append([]string{"nft"}, tt.nft...)...); err != nil {
				t.Fatal(err)
			}
			tampered := clusterSortedBlocks(s.ruleset())
			name, askErr := s.topo.Client.AskTCP(s.ctx, tt.broken)
			// The drift repair may undo it before we look (the sync counter
			// moves only after the repair is in the kernel, so the table is
			// read again too); only then may the tampering be invisible.
			if s.d.Syncs() == syncs && clusterSortedBlocks(s.ruleset()) == tampered {
				if tampered == want {
					t.Fatal("tampering changed nothing")
				}
				if askErr == nil {
					t.Errorf("%s still answered (%s) right after the tampering", tt.broken, name)
				}
			}
			took := s.eventually("repair", func() error {
				if diff := cmp.Diff(want, clusterSortedBlocks(s.ruleset())); diff != "" {
					return fmt.Errorf("ruleset, chains and sets in name order (-want +got):\n%s", diff)
				}
				return nil
			})
			// Nothing changed in the cluster: only the drift repair or the
			// periodic full sync can have repaired it.
			t.Logf("repaired after %s (sync period %s)", took.Round(time.Millisecond), period)
			for _, addr := range []netip.AddrPort{vip, np} {
				if err := s.answeredBy(addr, n0); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// testClusterServiceCIDRs: the daemon drops traffic to unallocated
// addresses of the cluster's ServiceCIDR objects, the default one the API
// server makes from --service-cluster-ip-range and those created later, and
// stops when one is deleted.
func testClusterServiceCIDRs(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-cidrs")
	rule := func(cidr string) string { return "ip daddr " + cidr + " drop" }
	if !strings.Contains(s.ruleset(), rule(apiserver.ServiceClusterIPRange)) {
		t.Fatalf("the default ServiceCIDR %s is not dropped:\n%s", apiserver.ServiceClusterIPRange, s.ruleset())
	}
	const extra = "10.97.0.0/24"
	unallocated := netip.MustParseAddrPort("10.97.0.5:80")
	// The node has no route to it: before the ServiceCIDR, it is unreachable at once.
	if _, err := s.topo.Client.AskTCP(s.ctx, unallocated); !clusterRefused(err) {
		t.Fatalf("ask %s before its ServiceCIDR: %v, want unreachable", unallocated, err)
	}
	cidrs := env.client.NetworkingV1().ServiceCIDRs()
	obj := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "e2e-extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extra}}}
	if _, err := cidrs.Create(s.ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager runs: the test removes the finalizer the
	// controller would, so the deletion completes.
	deleteCIDR := func(ctx context.Context) error {
		if err := cidrs.Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		_, err := cidrs.Patch(ctx, obj.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	t.Cleanup(func() {
		// The test's contexts are done by now.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := deleteCIDR(ctx); err != nil {
			t.Errorf("delete ServiceCIDR: %v", err)
		}
	})
	s.eventually("new ServiceCIDR dropped", func() error {
		if !strings.Contains(s.ruleset(), rule(extra)) {
			return fmt.Errorf("no %q in the ruleset", rule(extra))
		}
		return s.dropped(unallocated)
	})
	if err := deleteCIDR(s.ctx); err != nil {
		t.Fatal(err)
	}
	s.eventually("deleted ServiceCIDR no longer dropped", func() error {
		if strings.Contains(s.ruleset(), rule(extra)) {
			return fmt.Errorf("%q still in the ruleset", rule(extra))
		}
		if _, err := s.topo.Client.AskTCP(s.ctx, unallocated); !clusterRefused(err) {
			return fmt.Errorf("ask %s: %v, want unreachable", unallocated, err)
		}
		return nil
	})
}

// clusterSortedBlocks returns an nft listing with its tables, and the
// chains, sets and maps of each table, in name order; their contents are
// left as listed.
func clusterSortedBlocks(listing string) string {
	var tables, table, blocks, cur []string
	depth := 0
	for line := range strings.SplitSeq(strings.TrimRight(listing, "\n"), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case depth >= 2:
			cur = append(cur, line)
			if strings.HasSuffix(trimmed, "{") {
				depth++
			} else if trimmed == "}" {
				if depth--; depth == 1 {
					blocks = append(blocks, strings.Join(cur, "\n"))
					cur = nil
				}
			}
		case depth == 1 && strings.HasSuffix(trimmed, "{"):
			cur, depth = []string{line}, 2
		case depth == 1 && trimmed == "}":
			slices.Sort(blocks)
			table = append(append(table, blocks...), line)
			tables = append(tables, strings.Join(table, "\n"))
			table, blocks, depth = nil, nil, 0
		case depth == 1 && trimmed == "":
			// Blank lines between blocks go with the order.
		default:
			table = append(table, line)
			if strings.HasSuffix(trimmed, "{") {
				depth = 1
			}
		}
	}
	slices.Sort(tables)
	return strings.Join(append(tables, table...), "\n")
}

func TestClusterSortedBlocks(t *testing.T) {
	a := `table ip nftproxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto cluster-ip-1 }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
table ip6 nftproxy {
	chain b {
	}

	chain a {
	}
}
`
	b := `table ip nftproxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto cluster-ip-1 }
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
}
table ip6 nftproxy {
	chain a {
	}

	chain b {
	}
}
`
	// The kernel lists a recreated table last.
	b = b[strings.Index(b, "table ip6"):] + b[:strings.Index(b, "table ip6")]
	if diff := cmp.Diff(clusterSortedBlocks(a), clusterSortedBlocks(b)); diff != "" {
		t.Errorf("same blocks in another order (-a +b):\n%s", diff)
	}
	changed := strings.Replace(b, "jump services\n\t}\n\n\tchain nat-prerouting", "accept\n\t}\n\n\tchain nat-prerouting", 1)
	if clusterSortedBlocks(a) == clusterSortedBlocks(changed) {
		t.Error("a changed rule went unnoticed")
	}
	if got := strings.Count(clusterSortedBlocks(a), "chain "); got != 4 {
		t.Errorf("%d chains after sorting, want 4:\n%s", got, clusterSortedBlocks(a))
	}
}

// testClusterNodeDrainHealthz: /healthz fails, as kube-proxy's does
// (KEP-3836), while the node's Node object carries the Cluster Autoscaler's
// ToBeDeletedByClusterAutoscaler taint and once it has a deletionTimestamp
// (held by a finalizer, as a node being drained is); /livez stays 200 and
// the rules stay; the counters of answers by code follow.
func testClusterNodeDrainHealthz(t *testing.T, env *clusterEnv) {
	s := newClusterScenario(t, env, "e2e-drain")
	vip := netip.MustParseAddrPort("10.96.26.10:80")
	s.service("web", vip.Addr().String(), 0)
	a0, n0 := s.pods(0)
	s.slice("web", "web-a", a0...)
	s.eventually("service", func() error { return s.answeredBy(vip, n0) })
	if err := s.healthy(); err != nil {
		t.Fatal(err)
	}
	nodes := env.client.CoreV1().Nodes()
	ineligible := func() error {
		code, h, err := s.healthz("/healthz")
		switch {
		case err != nil:
			return err
		case code != http.StatusServiceUnavailable || h.NodeEligible == nil || *h.NodeEligible || !h.Healthy:
			return fmt.Errorf("/healthz: %d %+v, want 503, nodeEligible false, healthy true", code, h)
		}
		if code, h, err := s.healthz("/livez"); err != nil || code != http.StatusOK || h.NodeEligible != nil {
			return fmt.Errorf("/livez: %d %+v %v, want 200 without nodeEligible", code, h, err)
		}
		return s.answeredBy(vip, n0)
	}

	// The autoscaler's taint.
	node, err := nodes.Get(s.ctx, clusterNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.Taints = append(node.Spec.Taints, v1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Value: "1764000000", Effect: v1.TaintEffectNoSchedule})
	if node, err = nodes.Update(s.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := s.eventually("taint drains", ineligible)
	t.Logf("ToBeDeletedByClusterAutoscaler taint: /healthz 503 after %s", took.Round(time.Millisecond))
	node.Spec.Taints = nil
	if _, err = nodes.Update(s.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually("taint removed", s.healthy)

	// A deletion held by a finalizer: the Node stays, with a deletionTimestamp.
	const finalizer = "e2e.nftproxy.io/hold"
	if _, err := nodes.Patch(s.ctx, clusterNode, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["`+finalizer+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	restore := func(ctx context.Context) error {
		if _, err := nodes.Patch(ctx, clusterNode, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		clusterEventually(ctx, t, "node gone", func() error {
			if _, err := nodes.Get(ctx, clusterNode, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("node still there: %v", err)
			}
			return nil
		})
		fresh := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: clusterNode, Labels: node.Labels}}
		created, err := nodes.Create(ctx, fresh, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status.Addresses = node.Status.Addresses
		_, err = nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := restore(ctx); err != nil {
				t.Errorf("restore node: %v", err)
			}
		}
	})
	if err := nodes.Delete(s.ctx, clusterNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = s.eventually("deletion drains", ineligible)
	t.Logf("Node deleted (held by a finalizer): /healthz 503 after %s", took.Round(time.Millisecond))

	// Once the Node object is gone, kube-proxy has no node: still 503.
	restored = true
	if _, err := nodes.Patch(s.ctx, clusterNode, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s.eventually("node gone: still not eligible", ineligible)
	restored = false
	if err := restore(s.ctx); err != nil {
		t.Fatal(err)
	}
	restored = true
	s.eventually("node back", s.healthy)

	families, err := s.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, code string }{
		{"kubeproxy_proxy_healthz_total", "200"}, {"kubeproxy_proxy_healthz_total", "503"}, {"kubeproxy_proxy_livez_total", "200"},
	} {
		var got float64
		for _, m := range families[c.name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == c.code {
					got = m.GetCounter().GetValue()
				}
			}
		}
		if got < 1 {
			t.Errorf("%s{code=%q} = %v, want at least 1", c.name, c.code, got)
		}
	}
}
