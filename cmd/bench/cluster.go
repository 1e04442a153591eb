package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// The API objects of the peers phase: one Kubernetes namespace, one Node.
const (
	benchNamespace = "bench"
	benchNode      = "node-1"
	benchManagedBy = "nftproxy-bench" // not the EndpointSlice controller's value
	createWorkers  = 16
)

// cluster is a fresh etcd and kube-apiserver holding one workload.
type cluster struct {
	srv    *apiserver.Server
	client kubernetes.Interface
	// watcher asks for protobuf, as nftproxy and kube-proxy do: the bare
	// watches' client.
	watcher kubernetes.Interface
}

// startCluster starts an API server whose ClusterIP range holds 100,000
// services, and creates the bench's namespace and Node.
func startCluster(ctx context.Context) (*cluster, error) {
	srv, err := apiserver.Start(ctx, apiserver.Options{
		APIServerFlags: []string{"--service-cluster-ip-range=" + benchServiceCIDR.String()},
		StartTimeout:   2 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	c := &cluster{srv: srv}
	if err := c.init(ctx, *srv.RestConfig); err != nil {
		srv.Stop()
		return nil, err
	}
	return c, nil
}

func (c *cluster) stop() { c.srv.Stop() }

func (c *cluster) init(ctx context.Context, cfg rest.Config) (err error) {
	cfg.QPS, cfg.Burst = 5000, 10000 // the workload is written as fast as the server takes it
	cfg.UserAgent = "nftproxy-bench"
	proto := cfg
	proto.ContentType = "application/vnd.kubernetes.protobuf"
	if c.client, err = kubernetes.NewForConfig(&cfg); err == nil {
		c.watcher, err = kubernetes.NewForConfig(&proto)
	}
	if err != nil {
		return fmt.Errorf("make API client: %w", err)
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}
	if err := create(ctx, c.client.CoreV1().Namespaces(), "namespace", ns); err != nil {
		return err
	}
	// A Node's create keeps its status, as when a kubelet registers.
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}, Status: v1.NodeStatus{
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: netns.NodeAddr.String()}}}}
	return create(ctx, c.client.CoreV1().Nodes(), "node", node)
}

// create makes obj through api, one of client-go's typed clients.
func create[T metav1.Object](ctx context.Context, api interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
}, kind string, obj T) error {
	if _, err := api.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create %s %s: %w", kind, obj.GetName(), err)
	}
	return nil
}

func (c *cluster) createService(ctx context.Context, name string, ip netip.Addr) error {
	return create(ctx, c.client.CoreV1().Services(benchNamespace), "service", serviceObject(name, ip))
}

func (c *cluster) createSlice(ctx context.Context, service string, j int, addrs []netip.Addr, nodeOf func(netip.Addr) string) error {
	api := c.client.DiscoveryV1().EndpointSlices(benchNamespace)
	return create(ctx, api, "endpoint slice", sliceObject(service, j, addrs, nodeOf))
}

func serviceObject(name string, ip netip.Addr) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  ip.String(),
			ClusterIPs: []string{ip.String()},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(endpointPort)}},
		},
	}
}

func sliceObject(service string, j int, addrs []netip.Addr, nodeOf func(netip.Addr) string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName(service, j), Namespace: benchNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy:   benchManagedBy,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](endpointPort)}},
		Endpoints:   make([]discoveryv1.Endpoint, len(addrs)),
	}
	for i, a := range addrs {
		es.Endpoints[i] = readyEndpoint(a)
		if nodeOf != nil && nodeOf(a) != "" {
			es.Endpoints[i].NodeName = ptr.To(nodeOf(a))
		}
	}
	return es
}

func readyEndpoint(a netip.Addr) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{a.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}
}

// load writes every Service and EndpointSlice of w, with a pool of
// concurrent writers.
func (c *cluster) load(ctx context.Context, w *workload) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	services, slices := w.objects()
	total := services + slices
	var wg sync.WaitGroup
	var done atomic.Int64
	free := make(chan struct{}, createWorkers) // a token for each write in flight
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	write := func(job func() error) {
		for ctx.Err() == nil {
			select {
			case free <- struct{}{}:
				wg.Go(func() {
					defer func() { <-free }()
					if err := job(); err != nil {
						cancel(err) // the first error stays the cause
					} else {
						done.Add(1)
					}
				})
				return
			case <-ctx.Done():
			case <-tick.C:
				logf("  %d of %d objects written", done.Load(), total)
			}
		}
	}
	for i := range w.services {
		s := &w.services[i]
		write(func() error { return c.createService(ctx, s.name, s.clusterIP) })
		for j, addrs := range s.slices() {
			write(func() error { return c.createSlice(ctx, s.name, j, addrs, w.spec.nodeOf) })
		}
	}
	wg.Wait()
	err := context.Cause(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// The caller's deadline came before any write failed.
		return fmt.Errorf("%d of %d objects written: %w", done.Load(), total, err)
	}
	return err
}

// replaceEndpoint puts addr in place of the last endpoint of service i's
// last slice (on the node of the one it replaces), calling prepared just
// before the write.
func (c *cluster) replaceEndpoint(ctx context.Context, w *workload, i int, addr netip.Addr, prepared func()) error {
	s := &w.services[i]
	all := s.slices()
	es := sliceObject(s.name, len(all)-1, all[len(all)-1], w.spec.nodeOf)
	es.Endpoints[len(es.Endpoints)-1].Addresses = []string{addr.String()}
	prepared()
	return updateSlice(ctx, c.client, es)
}

// updateSlice writes es whole. No resourceVersion: the bench is the slices'
// only writer, and an unconditional update saves reading each slice first.
func updateSlice(ctx context.Context, client kubernetes.Interface, es *discoveryv1.EndpointSlice) error {
	if _, err := client.DiscoveryV1().EndpointSlices(benchNamespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpoint slice %s: %w", es.Name, err)
	}
	return nil
}

// Names of the service the service step adds.
func addedServiceName(k int) string { return fmt.Sprintf("added-%03d", k) }

// addedEndpoints are the three endpoints of the k-th added service, in
// 10.193.0.0/16, apart from every other address.
func addedEndpoints(k int) []netip.Addr {
	base := addrPlus(netip.MustParseAddr("10.193.0.1"), uint32(4*k))
	return []netip.Addr{base, addrPlus(base, 1), addrPlus(base, 2)}
}

// removeAdded deletes the k-th added service and its slice, so the next
// proxy starts from the workload alone.
func (c *cluster) removeAdded(ctx context.Context, k int) error {
	name := addedServiceName(k)
	err := c.client.CoreV1().Services(benchNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		err = c.client.DiscoveryV1().EndpointSlices(benchNamespace).Delete(ctx, sliceName(name, 0), metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete added service %s: %w", name, err)
	}
	return nil
}
