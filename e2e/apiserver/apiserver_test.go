package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

const testNS = metav1.NamespaceDefault

func clientset(t *testing.T, s *Server) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.RestConfig)
	if err != nil {
		t.Fatalf("make clientset: %v", err)
	}
	return cs
}

func webService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: testNS},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

func webSlice(addr string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "web-1",
			Namespace: testNS,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: "web",
				// Anything but the controller's value, so nothing reconciles it away.
				discoveryv1.LabelManagedBy: "nftproxy-e2e",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080),
		}},
	}
}

// readBack fetches the Service and the EndpointSlice and checks what the test wrote.
func readBack(ctx context.Context, t *testing.T, cs kubernetes.Interface) (*corev1.Service, *discoveryv1.EndpointSlice) {
	t.Helper()
	svc, err := cs.CoreV1().Services(testNS).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get service: %v", err)
	}
	slice, err := cs.DiscoveryV1().EndpointSlices(testNS).Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get endpointslice: %v", err)
	}
	if diff := cmp.Diff(webSlice("10.244.1.10").Endpoints, slice.Endpoints); diff != "" {
		t.Errorf("endpointslice endpoints (-want +got):\n%s", diff)
	}
	return svc, slice
}

func TestServiceAndSliceSurviveAPIServerRestart(t *testing.T) {
	s := Require(t)
	ctx := t.Context()
	cs := clientset(t, s)

	if _, err := cs.CoreV1().Services(testNS).Create(ctx, webService(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(testNS).Create(ctx, webSlice("10.244.1.10"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create endpointslice: %v", err)
	}
	svc, slice := readBack(ctx, t, cs)
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !netip.MustParsePrefix(ServiceClusterIPRange).Contains(ip) {
		t.Fatalf("service ClusterIP %q, want an address in %s", svc.Spec.ClusterIP, ServiceClusterIPRange)
	}

	s.StopAPIServer()
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Services(testNS).Get(down, "web", metav1.GetOptions{}); err == nil {
		t.Fatal("get service with kube-apiserver stopped: succeeded, want an error")
	}
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}

	svc2, slice2 := readBack(ctx, t, cs)
	type identity struct{ UID, ResourceVersion, ClusterIP string }
	if diff := cmp.Diff(
		[]identity{{string(svc.UID), svc.ResourceVersion, svc.Spec.ClusterIP}, {string(slice.UID), slice.ResourceVersion, ""}},
		[]identity{{string(svc2.UID), svc2.ResourceVersion, svc2.Spec.ClusterIP}, {string(slice2.UID), slice2.ResourceVersion, ""}},
	); diff != "" {
		t.Errorf("objects after restart (-before +after):\n%s", diff)
	}
}

func TestServerSideDryRun(t *testing.T) {
	s := Require(t)
	ctx := t.Context()
	cs := clientset(t, s)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	badPort := webService()
	badPort.Spec.Ports[0].Port = 0
	labels := map[string]string{"app": "proxy"}
	daemonSet := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "proxy", Namespace: testNS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork: true,
					Containers: []corev1.Container{{
						Name:            "proxy",
						Image:           "proxy",
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
					}},
				},
			},
		},
	}

	tests := []struct {
		name        string
		create      func() error
		get         func() error
		wantInvalid bool
	}{{
		name:   "valid service",
		create: func() error { _, err := cs.CoreV1().Services(testNS).Create(ctx, webService(), dryRun); return err },
		get:    func() error { _, err := cs.CoreV1().Services(testNS).Get(ctx, "web", metav1.GetOptions{}); return err },
	}, {
		name:        "service with port 0",
		create:      func() error { _, err := cs.CoreV1().Services(testNS).Create(ctx, badPort, dryRun); return err },
		get:         func() error { _, err := cs.CoreV1().Services(testNS).Get(ctx, "web", metav1.GetOptions{}); return err },
		wantInvalid: true,
	}, {
		name: "valid endpointslice",
		create: func() error {
			_, err := cs.DiscoveryV1().EndpointSlices(testNS).Create(ctx, webSlice("10.244.1.10"), dryRun)
			return err
		},
		get: func() error {
			_, err := cs.DiscoveryV1().EndpointSlices(testNS).Get(ctx, "web-1", metav1.GetOptions{})
			return err
		},
	}, {
		// Validation rejects loopback endpoints; dry-run must run it too.
		name: "endpointslice with a loopback address",
		create: func() error {
			_, err := cs.DiscoveryV1().EndpointSlices(testNS).Create(ctx, webSlice("127.0.0.1"), dryRun)
			return err
		},
		get: func() error {
			_, err := cs.DiscoveryV1().EndpointSlices(testNS).Get(ctx, "web-1", metav1.GetOptions{})
			return err
		},
		wantInvalid: true,
	}, {
		// A service proxy's DaemonSet is privileged on the host network.
		name: "privileged host-network daemonset",
		create: func() error {
			_, err := cs.AppsV1().DaemonSets(testNS).Create(ctx, daemonSet, dryRun)
			return err
		},
		get: func() error {
			_, err := cs.AppsV1().DaemonSets(testNS).Get(ctx, "proxy", metav1.GetOptions{})
			return err
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.create()
			if tc.wantInvalid != apierrors.IsInvalid(err) || (!tc.wantInvalid && err != nil) {
				t.Fatalf("dry-run create: error %v, want invalid=%v", err, tc.wantInvalid)
			}
			if err := tc.get(); !apierrors.IsNotFound(err) {
				t.Errorf("get after dry-run create: error %v, want NotFound (nothing stored)", err)
			}
		})
	}
}

func TestPauseAPIServer(t *testing.T) {
	s := Require(t)
	ctx := t.Context()
	cs := clientset(t, s)

	if err := s.PauseAPIServer(); err != nil {
		t.Fatalf("pause: %v", err)
	}
	hung, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := cs.CoreV1().Namespaces().Get(hung, testNS, metav1.GetOptions{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("get namespace while paused: error %v, want a deadline exceeded", err)
	}
	if err := s.ResumeAPIServer(); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, testNS, metav1.GetOptions{}); err != nil {
		t.Errorf("get namespace after resume: %v", err)
	}
}

func TestKubeconfig(t *testing.T) {
	s := Require(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("make clientset: %v", err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != Version || v.Major != "1" || v.Minor != "36" {
		t.Errorf("server version %s (major %q minor %q), want %s", v.GitVersion, v.Major, v.Minor, Version)
	}
}

// TestControllerManagerEndpointSlices checks the real EndpointSlice controller:
// with no kubelet, the test plays its part and writes the pod's status.
func TestControllerManagerEndpointSlices(t *testing.T) {
	s := Require(t)
	ctx := t.Context()
	cs := clientset(t, s)
	if err := s.StartControllerManager(ctx, "endpointslice-controller"); err != nil {
		t.Fatalf("start kube-controller-manager: %v", err)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	svc := webService()
	svc.Spec.Selector = map[string]string{"app": "web"}
	if _, err := cs.CoreV1().Services(testNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: testNS, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "web", Image: "web"}},
		},
	}
	pod, err := cs.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  "10.244.1.10",
		PodIPs: []corev1.PodIP{{IP: "10.244.1.10"}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
		},
	}
	if _, err := cs.CoreV1().Pods(testNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("write pod status: %v", err)
	}

	var got []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		slices, err := cs.DiscoveryV1().EndpointSlices(testNS).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=web," + discoveryv1.LabelManagedBy + "=endpointslice-controller.k8s.io",
		})
		if err != nil {
			return false, err
		}
		got = nil
		for _, sl := range slices.Items {
			for _, ep := range sl.Endpoints {
				got = append(got, fmt.Sprintf("%v ready=%v", ep.Addresses, ptr.Deref(ep.Conditions.Ready, false)))
			}
		}
		return len(got) > 0 && got[0] == "[10.244.1.10] ready=true", nil
	})
	if err != nil {
		t.Fatalf("wait for the controller's endpointslice: %v; endpoints seen: %v", err, got)
	}
}

func TestStartWithoutBinaries(t *testing.T) {
	_, err := Start(t.Context(), Options{BinDir: t.TempDir()})
	if !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Start with an empty binary directory: error %v, want ErrNotBuilt", err)
	}
}
