package proxier_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// trackerService is benchService(i) as API objects: the Service and its one
// EndpointSlice, whose third endpoint is the n-th address given.
func trackerService(i int) *v1.Service {
	sp := benchService(i)
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: sp.Name.Namespace, Name: sp.Name.Name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: sp.ClusterIPs[0].String(),
			ClusterIPs: []string{sp.ClusterIPs[0].String()},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	if sp.NodePort != 0 {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(sp.NodePort)
	}
	return s
}

func trackerSlice(i int, third uint32) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%05d", i)
	ready := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, n := range []uint32{uint32(3*i + 1), uint32(3*i + 2), third} {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{benchEndpoint(n).Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// BenchmarkTrackerSync is the user-space share of one change from the event
// to the kernel batch, with n services applied: the tracker takes the event,
// then the proxier syncs what it hands over (changes: the daemon's way), or
// the whole snapshot it builds (snapshot: every step walks every service).
// Each iteration makes a real change: one endpoint of one service replaced,
// or one service added (and, the next iteration, removed).
func BenchmarkTrackerSync(b *testing.B) {
	for _, n := range benchSizes {
		var services []*v1.Service
		var slices []*discoveryv1.EndpointSlice
		for i := range n {
			services = append(services, trackerService(i))
			slices = append(slices, trackerSlice(i, uint32(3*i+3)))
		}
		changes := map[string]func(tr *k8s.Tracker, i int){
			"endpoint-changed": func(tr *k8s.Tracker, i int) {
				tr.SetSlice(trackerSlice(n/2, uint32(1<<20+i%2)))
			},
			"service-added": func(tr *k8s.Tracker, i int) {
				if i%2 == 0 {
					tr.SetService(trackerService(n))
				} else {
					tr.DeleteService("default", fmt.Sprintf("svc-%05d", n))
				}
			},
		}
		for _, change := range []string{"endpoint-changed", "service-added"} {
			for _, way := range []string{"changes", "snapshot"} {
				b.Run(fmt.Sprintf("%s/%s/services=%d", change, way, n), func(b *testing.B) {
					tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
					tr.ReplaceAll(services, slices, nil)
					var k nopKernel
					p := syncedProxier(b, tr, proxier.Options{Kernel: &k})
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						changes[change](tr, i)
						var err error
						if way == "changes" {
							err = p.SyncChanges(context.Background(), tr.TakeChanges())
						} else {
							err = p.Sync(context.Background(), tr.Snapshot(), false)
						}
						if err != nil {
							b.Fatal(err)
						}
						i++
					}
					if k.deltas != i || k.full != 1 {
						b.Fatalf("%d deltas and %d full syncs for %d changes; want a delta each", k.deltas, k.full, i)
					}
				})
			}
		}
	}
}

// BenchmarkEndpointReplaced is the user-space share of a delta sync of one
// endpoint replaced, handed over as the one changed service port: the same
// 5,000 endpoints behind one service and spread over 1,666 services of
// three (the kernel's share: BenchmarkKernelSync).
func BenchmarkEndpointReplaced(b *testing.B) {
	wide := wideSnapshot(5000)
	small := benchSnapshot(1666)
	for _, w := range []struct {
		name       string
		snap, next *k8s.Snapshot
		port       int
	}{
		{"1x5000", wide, withWideEndpointReplaced(wide, 2500, 1<<20), 0},
		{"1666x3", small, withEndpointChanged(small, 833, 1<<20), 833},
		{"1x5000-etp-local", withWide(wide, wideLocalPolicy), withWide(withWideEndpointReplaced(wide, 2500, 1<<20+1), wideLocalPolicy), 0},
		{"1x5000-affinity", withWide(wide, wideAffinity), withWide(withWideEndpointReplaced(wide, 2500, 1<<20), wideAffinity), 0},
	} {
		b.Run(w.name, func(b *testing.B) {
			var k nopKernel
			p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: &k})
			if err := p.Sync(context.Background(), w.snap, true); err != nil {
				b.Fatal(err)
			}
			snaps := [2]*k8s.Snapshot{w.next, w.snap}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sp := &snaps[i%2].Services[w.port]
				ch := k8s.Changes{Ports: map[k8s.ServicePortName]*k8s.ServicePort{sp.Name: sp}, Node: w.snap.Node}
				if err := p.SyncChanges(context.Background(), ch); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if k.deltas != i {
				b.Fatalf("%d deltas for %d changes", k.deltas, i)
			}
		})
	}
}

// wideSlice is the s-th slice of 100 endpoints of one wide service
// (trackerService(0)); alt replaces its last endpoint.
func wideSlice(s int, alt bool) *discoveryv1.EndpointSlice {
	sl := endpointSlice(0, s, uint32(100*s+1), 100)
	if alt {
		sl.Endpoints[99].Addresses = []string{benchEndpoint(1 << 20).Addr.String()}
	}
	return sl
}

// endpointSlice is the s-th slice of trackerService(svc), with n ready
// endpoints from benchEndpoint(first) on.
func endpointSlice(svc, s int, first uint32, n int) *discoveryv1.EndpointSlice {
	ready := true
	name := fmt.Sprintf("svc-%05d", svc)
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("%s-%02d", name, s), Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for j := range n {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{benchEndpoint(first + uint32(j)).Addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return sl
}

// BenchmarkTrackerWideEndpoint is BenchmarkTrackerSync's endpoint change in
// one service of n endpoints in slices of 100 (5,000: 50 slices): the
// tracker takes the changed slice, the proxier syncs the one port it hands
// over. Its growth with n is what an endpoint change still costs per
// endpoint behind the service (docs/design.md, "What an endpoint change
// costs").
func BenchmarkTrackerWideEndpoint(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
			var slices []*discoveryv1.EndpointSlice
			for s := range n / 100 {
				slices = append(slices, wideSlice(s, false))
			}
			tr.ReplaceAll([]*v1.Service{trackerService(0)}, slices, nil)
			var k nopKernel
			p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: &k})
			tr.TakeChanges()
			if err := p.Sync(context.Background(), tr.Snapshot(), true); err != nil {
				b.Fatal(err)
			}
			mid := n / 200
			steps := [2]*discoveryv1.EndpointSlice{wideSlice(mid, true), wideSlice(mid, false)}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.SetSlice(steps[i%2])
				if err := p.SyncChanges(context.Background(), tr.TakeChanges()); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if k.deltas != i {
				b.Fatalf("%d deltas for %d changes", k.deltas, i)
			}
		})
	}
}

// BenchmarkKernelChange is a change from the tracker to the kernel, through
// netlink into a fresh network namespace (root only), with n services of
// three endpoints applied: one service added (and, the next iteration,
// removed), or one endpoint replaced. A service add puts a goto into the
// service-ips verdict map, after which the kernel validates every element
// of the table's verdict maps at commit (nft_setelem_validate): its share,
// sys-ms/op, grows with n (docs/design.md, "What a service add costs").
//
//	go test -run - -bench KernelChange ./proxier/
func BenchmarkKernelChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		var services []*v1.Service
		var slices []*discoveryv1.EndpointSlice
		for i := range n + 1 {
			if i < n {
				services = append(services, trackerService(i))
			}
			slices = append(slices, trackerSlice(i, uint32(3*i+3)))
		}
		for _, change := range []string{"service", "endpoint"} {
			b.Run(fmt.Sprintf("%s/%d", change, n), func(b *testing.B) {
				kernelSteps(b, services, slices, func(tr *k8s.Tracker, i int) {
					switch {
					case change == "endpoint":
						tr.SetSlice(trackerSlice(n/2, uint32(1<<20+i%2)))
					case i%2 == 0:
						tr.SetService(trackerService(n))
					default:
						tr.DeleteService("default", fmt.Sprintf("svc-%05d", n))
					}
				})
			})
		}
	}
}

// BenchmarkKernelNewCount is a service added, and the next iteration
// removed, through netlink into a fresh network namespace (root only), next
// to ten services of width endpoints each and one of three: the new service
// has three endpoints (count: a dispatch chain for three is there) or four
// (new: none is, so the batch adds the chain cluster-ip-4); scale is a wide
// service scaled to a new count and back beside small services. A chain's rule that
// reads a map binds it, and the kernel checks every element of a map at
// each new binding from another chain (nf_tables_bind_check_setelem): the
// new count's sys-ms/op grows with the endpoints of the whole table
// (docs/design.md, "What a new endpoint count costs the kernel").
//
//	go test -run - -bench KernelNewCount ./proxier/
func BenchmarkKernelNewCount(b *testing.B) {
	for _, width := range []int{1000, 3000, 6000} {
		services := []*v1.Service{trackerService(10)}
		slices := []*discoveryv1.EndpointSlice{endpointSlice(10, 0, 1<<20, 3)}
		for i := range 10 {
			services = append(services, trackerService(i))
			for s := range width / 100 {
				slices = append(slices, endpointSlice(i, s, uint32(i*width+100*s+1), 100))
			}
		}
		for _, count := range []struct {
			name string
			n    int
		}{{"count", 3}, {"new", 4}} {
			b.Run(fmt.Sprintf("%s/10x%d", count.name, width), func(b *testing.B) {
				kernelSteps(b, services, append(slices, endpointSlice(11, 0, 1<<21, count.n)), func(tr *k8s.Tracker, i int) {
					if i%2 == 0 {
						tr.SetService(trackerService(11))
					} else {
						tr.DeleteService("default", "svc-00011")
					}
				})
			})
		}
	}
	// A wide service scaled from 1,000 endpoints to 1,001 and back, a new
	// count each time, beside small services of three.
	for _, small := range []int{10000, 20000} {
		services := []*v1.Service{trackerService(small)}
		var slices []*discoveryv1.EndpointSlice
		for i := range small {
			services = append(services, trackerService(i))
			slices = append(slices, trackerSlice(i, uint32(3*i+3)))
		}
		for s := range 10 {
			slices = append(slices, endpointSlice(small, s, uint32(1<<21+100*s), 100))
		}
		b.Run(fmt.Sprintf("scale/%dx3+1x1000", small), func(b *testing.B) {
			kernelSteps(b, services, slices, func(tr *k8s.Tracker, i int) {
				tr.SetSlice(endpointSlice(small, 9, 1<<21+900, 100+(i+1)%2))
			})
		})
	}
}

// kernelSteps applies the objects through netlink into a fresh network
// namespace (root only), then times, each iteration, the delta sync of what
// step(i) changed in the tracker, as cpu-ms/op and sys-ms/op.
func kernelSteps(b *testing.B, services []*v1.Service, slices []*discoveryv1.EndpointSlice, step func(tr *k8s.Tracker, i int)) {
	ns := netns.New(b, "pxc")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
	tr.ReplaceAll(services, slices, nil)
	p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: nftnl.Kernel{Conn: conn}})
	tr.TakeChanges()
	if err := p.Sync(context.Background(), tr.Snapshot(), true); err != nil {
		b.Fatal(err)
	}
	var meter cpuMeter
	i := 0
	for b.Loop() {
		step(tr, i)
		meter.start()
		if err := p.SyncChanges(context.Background(), tr.TakeChanges()); err != nil {
			b.Fatal(err)
		}
		meter.stop()
		i++
	}
	meter.report(b)
}

// BenchmarkHealthCheckedEndpoint is BenchmarkTrackerSync's endpoint change
// (the daemon's way) in a load balancer service with
// externalTrafficPolicy Local, whose health check node port server (on
// loopback) follows its local endpoints: that change must not cost a walk
// of every service either.
func BenchmarkHealthCheckedEndpoint(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			var services []*v1.Service
			var slices []*discoveryv1.EndpointSlice
			for i := range n {
				services = append(services, trackerService(i))
				slices = append(slices, trackerSlice(i, uint32(3*i+3)))
			}
			lb := services[n/2]
			lb.Spec.Type, lb.Spec.ExternalTrafficPolicy, lb.Spec.HealthCheckNodePort = v1.ServiceTypeLoadBalancer, v1.ServiceExternalTrafficPolicyLocal, 32000
			lb.Spec.Ports[0].NodePort = 31999
			lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.168.50.10"}}
			tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
			tr.ReplaceAll(services, slices, nil)
			hc := proxier.NewHealthChecks(nil, proxier.NewHealth(60e9), proxier.HealthCheckOptions{
				Listen: func(string, netip.AddrPort) (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }})
			defer hc.Close()
			p := syncedProxier(b, tr, proxier.Options{Kernel: &nopKernel{}, HealthChecks: hc})
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.SetSlice(trackerSlice(n/2, uint32(1<<20+i%2)))
				if err := p.SyncChanges(context.Background(), tr.TakeChanges()); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// syncedProxier is a proxier of benchConfig with opts that has synced the
// tracker's state in full, its changes taken.
func syncedProxier(b *testing.B, tr *k8s.Tracker, opts proxier.Options) *proxier.Proxier {
	opts.Configs = []proxier.Config{benchConfig}
	p := proxier.New(opts)
	tr.TakeChanges()
	if err := p.Sync(context.Background(), tr.Snapshot(), true); err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkTrackerWideFirstChange is BenchmarkTrackerWideEndpoint's change
// made first after a full sync, as the peers phase makes it: the cost of a
// wide port's first patch, which has no lists of an earlier patch to start
// from.
func BenchmarkTrackerWideFirstChange(b *testing.B) {
	tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
	var slices []*discoveryv1.EndpointSlice
	for s := range 50 {
		slices = append(slices, wideSlice(s, false))
	}
	tr.ReplaceAll([]*v1.Service{trackerService(0)}, slices, nil)
	var k nopKernel
	p := syncedProxier(b, tr, proxier.Options{Kernel: &k})
	steps := [2]*discoveryv1.EndpointSlice{wideSlice(25, true), wideSlice(25, false)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		tr.TakeChanges()
		if err := p.Sync(context.Background(), tr.Snapshot(), true); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		tr.SetSlice(steps[i%2])
		if err := p.SyncChanges(context.Background(), tr.TakeChanges()); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
