package k8s

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// snapshotText renders a snapshot's service ports one per line: the name,
// then each endpoint as address:port, marked "!" when not ready.
func snapshotText(snap *Snapshot) string {
	var lines []string
	for _, sp := range snap.Services {
		line := sp.Name.String()
		for _, e := range sp.Endpoints {
			line += fmt.Sprintf(" %s:%d", e.Addr, e.Port)
			if !e.Ready {
				line += "!"
			}
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// clientOp is one write through the fake clientset, as a user or a
// controller would make it.
type clientOp func(ctx context.Context, c *fake.Clientset) error

func createService(s *v1.Service) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		_, err := c.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		return err
	}
}

func updateService(s *v1.Service) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		_, err := c.CoreV1().Services(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
}

func deleteService(ns, name string) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		return c.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

func createSlice(s *discoveryv1.EndpointSlice) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		_, err := c.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		return err
	}
}

func updateSlice(s *discoveryv1.EndpointSlice) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		_, err := c.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
}

func deleteSliceOp(ns, name string) clientOp {
	return func(ctx context.Context, c *fake.Clientset) error {
		return c.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

// TestInformersEventSequences follows sequences of writes the informers may
// deliver in any order against a real API server (slices before their
// service, services changing kind, objects coming back), and checks the
// snapshot after each.
func TestInformersEventSequences(t *testing.T) {
	const v4 = discoveryv1.AddressTypeIPv4
	web := svc("default", "web")
	webSlice := slice("default", "web-a", "web", v4, ep("10.244.1.1"))
	const webWithEndpoint = "default/web:http 10.244.1.1:8080"
	const webAlone = "default/web:http"

	externalName := svc("default", "web", withClusterIPs(), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeExternalName
		s.Spec.ExternalName = "example.com"
	})
	headlessSlice := webSlice.DeepCopy()
	headlessSlice.Labels[v1.IsHeadlessService] = ""
	otherProxySlice := webSlice.DeepCopy()
	otherProxySlice.Labels[LabelServiceProxyName] = "someone-else"
	unlabelledSlice := webSlice.DeepCopy()
	delete(unlabelledSlice.Labels, discoveryv1.LabelServiceName)
	otherPortSlice := webSlice.DeepCopy()
	otherPortSlice.Ports[0].Name = ptr("metrics")

	type step struct {
		op   clientOp
		want string
	}
	tests := []struct {
		name    string
		initial []runtime.Object
		want    string // after the initial list
		steps   []step
	}{
		{
			name:    "slice before its service",
			initial: []runtime.Object{webSlice},
			want:    "",
			steps:   []step{{createService(web), webWithEndpoint}},
		},
		{
			name:    "service deleted and created again finds its slice",
			initial: []runtime.Object{web, webSlice},
			want:    webWithEndpoint,
			steps: []step{
				{deleteService("default", "web"), ""},
				{createService(web), webWithEndpoint},
			},
		},
		{
			name:    "service turned ExternalName and back",
			initial: []runtime.Object{web, webSlice},
			want:    webWithEndpoint,
			steps: []step{
				{updateService(externalName), ""},
				{updateService(web), webWithEndpoint},
			},
		},
		{
			name:    "slice labelled headless, then for another proxy, then plain",
			initial: []runtime.Object{web, webSlice},
			want:    webWithEndpoint,
			steps: []step{
				{updateSlice(headlessSlice), webAlone},
				{updateSlice(otherProxySlice), webAlone},
				{updateSlice(webSlice), webWithEndpoint},
			},
		},
		{
			name:    "slice losing its service-name label",
			initial: []runtime.Object{web, webSlice},
			want:    webWithEndpoint,
			steps: []step{
				{updateSlice(unlabelledSlice), webAlone},
				{updateSlice(webSlice), webWithEndpoint},
			},
		},
		{
			name:    "slice port name not the service's",
			initial: []runtime.Object{web, otherPortSlice},
			want:    webAlone,
			steps:   []step{{updateSlice(webSlice), webWithEndpoint}},
		},
		{
			name:    "same service name in two namespaces",
			initial: []runtime.Object{web, svc("other", "web", withClusterIPs("10.96.0.11")), webSlice},
			want:    webWithEndpoint + "\nother/web:http",
			steps: []step{
				{createSlice(slice("other", "web-a", "web", v4, ep("10.244.2.1"))), webWithEndpoint + "\nother/web:http 10.244.2.1:8080"},
				{deleteSliceOp("default", "web-a"), webAlone + "\nother/web:http 10.244.2.1:8080"},
			},
		},
		{
			name: "one endpoint in two slices: the best conditions, then what is left",
			initial: []runtime.Object{web, slice("default", "web-a", "web", v4, ep("10.244.1.1", notReady), ep("10.244.1.2")),
				slice("default", "web-b", "web", v4, ep("10.244.1.1"))},
			want: "default/web:http 10.244.1.1:8080 10.244.1.2:8080",
			steps: []step{
				{deleteSliceOp("default", "web-b"), "default/web:http 10.244.1.1:8080! 10.244.1.2:8080"},
				{createSlice(slice("default", "web-c", "web", v4, ep("10.244.1.3"))), "default/web:http 10.244.1.1:8080! 10.244.1.2:8080 10.244.1.3:8080"},
				{deleteSliceOp("default", "web-a"), "default/web:http 10.244.1.3:8080"},
				{deleteSliceOp("default", "web-c"), webAlone},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, tr, _ := startInformers(t, tt.initial...)
			if diff := cmp.Diff(tt.want, snapshotText(tr.Snapshot())); diff != "" {
				t.Fatalf("after the initial list (-want +got):\n%s", diff)
			}
			for i, s := range tt.steps {
				if err := s.op(t.Context(), client); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				eventually(t, func() string {
					if diff := cmp.Diff(s.want, snapshotText(tr.Snapshot())); diff != "" {
						return fmt.Sprintf("step %d (-want +got):\n%s", i, diff)
					}
					return ""
				})
			}
		})
	}
}
