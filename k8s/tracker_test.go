package k8s

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// fixtures is a small cluster: service web (dual-stack, three slices, one
// endpoint in two of them), service dns (UDP), and services nftproxy must
// ignore or skip.
func fixtures() []runtime.Object {
	web := svc("default", "web", withClusterIPs("10.96.0.10", "fd00::10"))
	dns := svc("kube-system", "dns", withClusterIPs("10.96.0.53"),
		withPorts(v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}))
	headless := svc("default", "headless", withClusterIPs("None"))
	headlessLabel := svc("default", "headless-label", withClusterIPs("10.96.0.20"),
		func(s *v1.Service) { s.Labels = map[string]string{v1.IsHeadlessService: ""} })
	other := svc("default", "other-proxy", withClusterIPs("10.96.0.21"),
		func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "someone-else"} })
	extName := svc("default", "ext", withClusterIPs(), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeExternalName
		s.Spec.ExternalName = "example.com"
	})
	bad := svc("default", "bad", withClusterIPs("10.96.0.300"))

	a := slice("default", "web-a", "web", discoveryv1.AddressTypeIPv4, ep("10.244.1.2"), ep("10.244.1.1", notReady))
	b := slice("default", "web-b", "web", discoveryv1.AddressTypeIPv4, ep("10.244.1.1"), ep("10.244.1.3", terminating(true)))
	six := slice("default", "web-v6", "web", discoveryv1.AddressTypeIPv6, ep("fd00:244::1"))
	dnsSlice := slice("kube-system", "dns-x", "dns", discoveryv1.AddressTypeIPv4, ep("10.244.2.1"))
	dnsSlice.Ports[0] = discoveryv1.EndpointPort{Name: ptr("dns"), Port: ptr[int32](53), Protocol: ptr(v1.ProtocolUDP)}
	headlessSlice := slice("default", "headless-x", "headless", discoveryv1.AddressTypeIPv4, ep("10.244.3.1"))
	headlessSlice.Labels[v1.IsHeadlessService] = ""

	return []runtime.Object{web, dns, headless, headlessLabel, other, extName, bad, a, b, six, dnsSlice, headlessSlice,
		node("node-a", "z1", "192.168.1.10"), node("node-b", "z2", "192.168.1.11")}
}

func node(name, zone string, addr ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelTopologyZone: zone}}}
	for _, a := range addr {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func wantFixtureServices() []ServicePort {
	dns := basePort("kube-system", "dns", "dns", UDP, 53)
	dns.ClusterIPs = addrs("10.96.0.53")
	dns.Endpoints = []Endpoint{endpoint("10.244.2.1", 53)}
	web := basePort("default", "web", "http", TCP, 80)
	web.ClusterIPs = addrs("10.96.0.10", "fd00::10")
	term := endpoint("10.244.1.3", 8080)
	term.Ready, term.Terminating = false, true
	web.Endpoints = []Endpoint{endpoint("10.244.1.1", 8080), endpoint("10.244.1.2", 8080), term, endpoint("fd00:244::1", 8080)}
	return []ServicePort{web, dns}
}

func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(core), logs
}

// eventually polls f until it returns "" or a deadline passes.
func eventually(t *testing.T, f func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startInformers(t *testing.T, objs ...runtime.Object) (*fake.Clientset, *Tracker, *observer.ObservedLogs) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset(objs...)
	log, logs := observed()
	tr := NewTracker(log, TrackerOptions{FallbackNode: Node{Name: "node-a", Addrs: addrs("192.168.9.9")}})
	synced := RunInformers(ctx, client, "node-a", tr, log)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := WaitForSync(wctx, synced); err != nil {
		t.Fatal(err)
	}
	return client, tr, logs
}

func TestInformersInitialSnapshot(t *testing.T) {
	_, tr, logs := startInformers(t, fixtures()...)
	snap := tr.Snapshot()
	if diff := cmp.Diff(wantFixtureServices(), snap.Services, cmpAddrs); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	wantNode := Node{Name: "node-a", Zone: "z1", Addrs: addrs("192.168.1.10"), Labels: map[string]string{v1.LabelTopologyZone: "z1"}}
	if diff := cmp.Diff(wantNode, snap.Node, cmpAddrs); diff != "" {
		t.Errorf("node (-want +got):\n%s", diff)
	}
	bad := logs.FilterField(zap.String("name", "bad"))
	if bad.Len() != 1 || !strings.Contains(bad.All()[0].ContextMap()["error"].(string), "default/bad") {
		t.Errorf("want one warning about default/bad, got %v", bad.All())
	}
	skipped := tr.Skipped()
	if len(skipped) != 1 || !errors.Is(skipped[0], ErrInvalidIP) {
		t.Errorf("Skipped() = %v, want the invalid cluster IP of default/bad", skipped)
	}
	if st := tr.Stats(); st.Invalid != 1 || st.ServiceChanges != 2 || st.EndpointChanges == 0 {
		t.Errorf("stats = %+v", st)
	}
	if tr.Snapshot() != snap {
		t.Error("Snapshot rebuilt without a change")
	}
}

func TestInformersFollowChanges(t *testing.T) {
	client, tr, _ := startInformers(t, fixtures()...)
	ctx := context.Background()
	first := tr.Snapshot()
	drain(tr)

	// A slice gone: its endpoints go, the same address from another slice
	// stays.
	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		got := endpointAddrs(tr.Snapshot(), "web")
		if want := "10.244.1.1 10.244.1.3 fd00:244::1"; got != want {
			return "web endpoints " + got + ", want " + want
		}
		return ""
	})
	select {
	case <-tr.Changed():
	default:
		t.Error("no change signalled")
	}

	// A service labelled for another proxy after the fact disappears: the
	// fake clientset doesn't filter watches, so this tests the tracker.
	dns, err := client.CoreV1().Services("kube-system").Get(ctx, "dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dns.Labels = map[string]string{LabelServiceProxyName: "x"}
	if _, err := client.CoreV1().Services("kube-system").Update(ctx, dns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if n := len(tr.Snapshot().Services); n != 1 {
			return "want only web left"
		}
		return ""
	})

	// A new headless service added later is ignored; deleting web empties
	// the snapshot.
	if _, err := client.CoreV1().Services("default").Create(ctx, svc("default", "late", withClusterIPs("None")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if n := len(tr.Snapshot().Services); n != 0 {
			return "services left after deleting web"
		}
		return ""
	})

	// The node's zone changes; other nodes are not this node.
	n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[v1.LabelTopologyZone] = "z9"
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node("node-c", "z3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if z := tr.Snapshot().Node.Zone; z != "z9" {
			return "zone " + z + ", want z9"
		}
		return ""
	})
	// The autoscaler's taint reaches the snapshot: /healthz drains on it.
	n.Spec.Taints = []v1.Taint{{Key: TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}
	if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if got := tr.Snapshot().Node; got.Eligible() || got.Fallback {
			return fmt.Sprintf("node %+v, want the tainted Node object", got)
		}
		return ""
	})
	if err := client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if got := tr.Snapshot().Node; got.Zone != "" || got.Addrs[0] != netip.MustParseAddr("192.168.9.9") || !got.Fallback {
			return "node not back to the fallback"
		}
		return ""
	})
	if first.Services[0].Endpoints[0].Addr != netip.MustParseAddr("10.244.1.1") || len(first.Services) != 2 {
		t.Error("an earlier snapshot changed")
	}
}

func drain(tr *Tracker) {
	select {
	case <-tr.Changed():
	default:
	}
}

func endpointAddrs(snap *Snapshot, name string) string {
	var out []string
	for _, sp := range snap.Services {
		if sp.Name.Name == name {
			for _, e := range sp.Endpoints {
				out = append(out, e.Addr.String())
			}
		}
	}
	return strings.Join(out, " ")
}

func TestTrackerChangedCoalesces(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	tr.SetService(svc("default", "a"))
	tr.SetService(svc("default", "b", withClusterIPs("10.96.0.11")))
	<-tr.Changed()
	select {
	case <-tr.Changed():
		t.Fatal("two signals for changes made before one read")
	default:
	}
	// Setting an equal object is no change.
	tr.SetService(svc("default", "a"))
	select {
	case <-tr.Changed():
		t.Fatal("signal without a change")
	default:
	}
	tr.DeleteService("default", "nope")
	tr.DeleteSlice("default", "nope")
	select {
	case <-tr.Changed():
		t.Fatal("signal for deleting what was not there")
	default:
	}
}

func TestTrackerConflicts(t *testing.T) {
	var mu sync.Mutex
	var hooked []string
	tr := NewTracker(nil, TrackerOptions{OnInvalid: func(kind, ns, name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		hooked = append(hooked, kind+" "+ns+"/"+name)
	}})
	older := svc("default", "zz-older")
	older.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	newer := svc("default", "aa-newer")
	newer.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	// Same VIP on another port is no conflict.
	otherPort := svc("default", "other-port", withPorts(v1.ServicePort{Name: "x", Port: 81}))
	np := func(name string, clusterIP string) *v1.Service {
		return svc("default", name, withClusterIPs(clusterIP), func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, NodePort: 30080}}
		})
	}
	// An external IP equal to another service's cluster IP conflicts too.
	ext := svc("default", "ext", withClusterIPs("10.96.1.1"), func(s *v1.Service) { s.Spec.ExternalIPs = []string{"10.96.0.10"} })
	tr.ReplaceAll([]*v1.Service{older, newer, otherPort, np("np-a", "10.96.2.1"), np("np-b", "10.96.2.2"), ext}, nil, nil)

	var names []string
	for _, sp := range tr.Snapshot().Services {
		names = append(names, sp.Name.String())
	}
	want := []string{"default/np-a:http", "default/other-port:x", "default/zz-older:http"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	var skipped []string
	for _, e := range tr.Skipped() {
		if !errors.Is(e, ErrConflict) {
			t.Errorf("unexpected problem %v", e)
		}
		skipped = append(skipped, e.Namespace+"/"+e.Name)
	}
	if diff := cmp.Diff([]string{"default/aa-newer", "default/ext", "default/np-b"}, skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	mu.Lock()
	if len(hooked) != 3 {
		t.Errorf("OnInvalid called for %v, want each conflict once", hooked)
	}
	mu.Unlock()

	// The older one gone, the newer one takes the address.
	tr.DeleteService("default", "zz-older")
	if got := endpointNames(tr.Snapshot()); !strings.Contains(got, "default/aa-newer:http") {
		t.Errorf("services %s, want aa-newer back", got)
	}
}

func endpointNames(snap *Snapshot) string {
	var out []string
	for _, sp := range snap.Services {
		out = append(out, sp.Name.String())
	}
	return strings.Join(out, " ")
}

func TestTrackerReplaceAll(t *testing.T) {
	log, logs := observed()
	tr := NewTracker(log, TrackerOptions{FallbackNode: Node{Name: "me", Addrs: addrs("192.168.9.9")}})
	web := svc("default", "web")
	s1 := slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4, ep("10.244.0.1"))
	bad := slice("default", "web-bad", "web", discoveryv1.AddressTypeIPv4, ep("10.244.0.500"), ep("10.244.0.2"))
	tr.ReplaceAll([]*v1.Service{web}, []*discoveryv1.EndpointSlice{s1, bad}, nil)
	if got := endpointAddrs(tr.Snapshot(), "web"); got != "10.244.0.1 10.244.0.2" {
		t.Errorf("endpoints %q", got)
	}
	if got := tr.Snapshot().Node; got.Name != "me" {
		t.Errorf("node %v, want the fallback", got)
	}
	if logs.Len() != 1 {
		t.Errorf("want one warning, got %v", logs.All())
	}
	drain(tr)

	// The same objects again (decoded anew): no change, no new warning.
	tr.ReplaceAll([]*v1.Service{web.DeepCopy()}, []*discoveryv1.EndpointSlice{s1.DeepCopy(), bad.DeepCopy()}, nil)
	select {
	case <-tr.Changed():
		t.Error("change signalled for identical objects")
	default:
	}
	if logs.Len() != 1 {
		t.Errorf("warning repeated: %v", logs.All())
	}

	// Without the slices and with a Node that has no addresses.
	tr.ReplaceAll([]*v1.Service{web}, nil, node("me", "z1"))
	snap := tr.Snapshot()
	if len(snap.Services) != 1 || snap.Services[0].Endpoints != nil {
		t.Errorf("services %+v, want web without endpoints", snap.Services)
	}
	if snap.Node.Zone != "z1" || len(snap.Node.Addrs) != 1 || snap.Node.Addrs[0] != netip.MustParseAddr("192.168.9.9") {
		t.Errorf("node %+v, want zone z1 and the fallback address", snap.Node)
	}
	if len(tr.Skipped()) != 0 {
		t.Errorf("problems of deleted objects remain: %v", tr.Skipped())
	}
}

func TestTrackerSliceMovesService(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	tr.SetService(svc("default", "a"))
	tr.SetService(svc("default", "b", withClusterIPs("10.96.0.11")))
	s := slice("default", "s", "a", discoveryv1.AddressTypeIPv4, ep("10.244.0.1"))
	tr.SetSlice(s)
	if endpointAddrs(tr.Snapshot(), "a") != "10.244.0.1" {
		t.Fatal("slice not attached to a")
	}
	s = s.DeepCopy()
	s.Labels[discoveryv1.LabelServiceName] = "b"
	tr.SetSlice(s)
	snap := tr.Snapshot()
	if endpointAddrs(snap, "a") != "" || endpointAddrs(snap, "b") != "10.244.0.1" {
		t.Errorf("after relabel: a=%q b=%q", endpointAddrs(snap, "a"), endpointAddrs(snap, "b"))
	}
}

func TestTrackerConcurrentUse(t *testing.T) {
	tr := NewTracker(nil, TrackerOptions{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 200 {
				s := svc("default", "web")
				s.Spec.Ports[0].Port = int32(1 + (i*200+j)%1000)
				tr.SetService(s)
				tr.SetSlice(slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4, ep("10.244.0.1")))
				_ = tr.Snapshot()
				if j%10 == 0 {
					tr.DeleteSlice("default", "web-1")
				}
			}
		})
	}
	wg.Wait()
	if n := len(tr.Snapshot().Services); n != 1 {
		t.Errorf("%d services", n)
	}
}

func TestSnapshotLookup(t *testing.T) {
	snap := &Snapshot{Services: wantFixtureServices()}
	for _, sp := range snap.Services {
		if got := snap.Lookup(sp.Name); got == nil || got.Name != sp.Name {
			t.Errorf("Lookup(%v) = %v", sp.Name, got)
		}
	}
	if got := snap.Lookup(ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: UDP}); got != nil {
		t.Errorf("Lookup of a missing port = %v", got.Name)
	}
}

func TestDeleteKeyTombstone(t *testing.T) {
	tests := []struct {
		name string
		obj  any
		want string
	}{
		{"object", svc("default", "web"), "default/web"},
		{"tombstone", cache.DeletedFinalStateUnknown{Key: "default/web", Obj: svc("default", "web")}, "default/web"},
		{"cluster-scoped", node("node-a", "z1"), "/node-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			deleteKey(zap.NewNop(), KindService, tt.obj, func(ns, name string) { got = ns + "/" + name })
			if got != tt.want {
				t.Errorf("deleted %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSlimDropsWhatCachesNeedNot(t *testing.T) {
	s := svc("default", "web")
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	s.Annotations = map[string]string{v1.LastAppliedConfigAnnotation: `{"big":"json"}`, "keep": "me"}
	got, err := slim(s)
	if err != nil {
		t.Fatal(err)
	}
	gs := got.(*v1.Service)
	if gs.ManagedFields != nil || !maps.Equal(gs.Annotations, map[string]string{"keep": "me"}) {
		t.Errorf("slim kept managed fields %v or annotations %v", gs.ManagedFields, gs.Annotations)
	}
	// Tombstones of deleted objects pass through.
	tomb := cache.DeletedFinalStateUnknown{Key: "default/web", Obj: s}
	if got, err := slim(tomb); err != nil || got != tomb {
		t.Errorf("slim(tombstone) = %v, %v", got, err)
	}
}
