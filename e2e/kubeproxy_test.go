package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// The reference: where a test says nftproxy behaves "as kube-proxy does", it
// runs the real kube-proxy (built by e2e/apiserver/build.sh at the test API
// server's version) in a namespace of its own, the same way, and checks both.

// kubeProxyBinary is the reference kube-proxy; tests skip without it.
func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(apiserver.DefaultBinDir(), "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("skipping the reference kube-proxy: %v; build it with e2e/apiserver/build.sh", err)
	}
	return bin
}

// startReferenceKubeProxy runs the reference kube-proxy in ns against env's API
// server (through a relay in ns) with config, a KubeProxyConfiguration body
// without apiVersion, kind and clientConnection; it waits for kube-proxy's
// /healthz to answer 200, which it does after its first sync.
func startReferenceKubeProxy(t *testing.T, env *clusterEnv, ns *netns.NS, config string) *Daemon {
	t.Helper()
	bin := kubeProxyBinary(t)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	relay, err := env.srv.Relay(ns, "", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Close)
	file := filepath.Join(dir, "kube-proxy.yaml")
	body := fmt.Sprintf("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"clientConnection:\n  kubeconfig: %s\nhostnameOverride: %s\n"+
		"healthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n%s", kubeconfig, clusterNode, config)
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := StartCommand(ns, bin, "--config", file, "-v", "2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Kill()
		if t.Failed() {
			t.Logf("kube-proxy log:\n%s", d.Log())
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	clusterEventually(ctx, t, "kube-proxy's first sync", func() error {
		select {
		case <-d.done:
			return fmt.Errorf("kube-proxy exited: %s", d.Log())
		default:
		}
		code, _, err := ns.Get(ctx, "http://127.0.0.1:10256/healthz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/healthz: %d", code)
		}
		return err
	})
	return d
}

// createNodePortService creates, in the API server, the NodePort service
// ns/name on port 80 (nodePort np) with one ready endpoint at pod:8080, the
// objects the manifest svcSpec{name, ip, nodePort: np, endpoints: pod} gives
// nftproxy; mods change the service before it is created.
func (env *clusterEnv) createNodePortService(ctx context.Context, t *testing.T, ns, name, clusterIP string, np int32, pod string, mods ...func(*v1.Service)) {
	t.Helper()
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: np}}},
	}
	for _, m := range mods {
		m(svc)
	}
	if _, err := env.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{pod}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To(clusterNode)}},
	}
	if _, err := env.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpoint slice: %v", err)
	}
}
