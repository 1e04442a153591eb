package deploy

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
)

// render builds the kustomization in this directory as `kubectl apply -k`
// would, with kustomize's own library.
func render(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("render the kustomization: %v", err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		j, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		out = append(out, u)
	}
	return out
}

func TestKustomizationRenders(t *testing.T) {
	var got []string
	for _, u := range render(t) {
		got = append(got, fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName()))
	}
	want := []string{
		"ServiceAccount kube-system/nftproxy",
		"ClusterRole /nftproxy",
		"ClusterRoleBinding /nftproxy",
		"ConfigMap kube-system/nftproxy",
		"DaemonSet kube-system/nftproxy",
	}
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("rendered %q, want %q", got, want)
	}
}

const (
	serviceAccount = "system:serviceaccount:kube-system:nftproxy"
	fieldManager   = "nftproxy-deploy-test"
)

// access is one request of the service account, as a SubjectAccessReview
// asks it.
type access struct {
	verb, group, resource, subresource string
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.group != "" {
		s += "." + a.group
	}
	return s
}

// TestKustomizationAppliesAndGrantsOnlyReads renders the kustomization and
// applies every object to a real kube-apiserver with a server-side dry run
// (kubectl apply -k --server-side --dry-run=server: defaulting, validation
// and admission, nothing stored), then applies the RBAC objects for real and
// asks the API server's authorizer with SubjectAccessReviews what the
// daemon's service account may do: what the informers need (k8s.RunInformers
// lists and watches services, endpointslices, its node and servicecidrs),
// and nothing else.
func TestKustomizationAppliesAndGrantsOnlyReads(t *testing.T) {
	srv := apiserver.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	objs := render(t)
	api := newDynamicAPI(t, srv)
	waitForNamespaces(ctx, t, srv, metav1.NamespaceSystem)
	resource := func(u *unstructured.Unstructured) dynamic.ResourceInterface { return api.resource(t, u, "") }
	apply := func(u *unstructured.Unstructured, dryRun bool) error {
		opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := resource(u).Apply(ctx, u.GetName(), u, opts)
		return err
	}

	for _, u := range objs {
		if err := apply(u, true); err != nil {
			t.Errorf("server-side dry run of %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	cs, err := kubernetes.NewForConfig(srv.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	if dss, err := cs.AppsV1().DaemonSets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{}); err != nil || len(dss.Items) != 0 {
		t.Fatalf("after the dry run: %d DaemonSets, error %v; want none stored", len(dss.Items), err)
	}

	for _, u := range objs {
		if u.GetKind() == "ClusterRole" || u.GetKind() == "ClusterRoleBinding" {
			if err := apply(u, false); err != nil {
				t.Fatalf("apply %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	allowed := func(a access) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   serviceAccount,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
			},
		}}
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("review %s: %w", a, err)
		}
		return res.Status.Allowed, nil
	}

	// What the daemon's informers do.
	var needed []access
	for _, r := range []struct{ group, resource string }{
		{"", "services"}, {"discovery.k8s.io", "endpointslices"}, {"", "nodes"}, {"networking.k8s.io", "servicecidrs"},
	} {
		for _, verb := range []string{"list", "watch"} {
			needed = append(needed, access{verb: verb, group: r.group, resource: r.resource})
		}
	}
	// The authorizer learns of new bindings from its informers: wait for the
	// first grant, then ask every question once.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return allowed(needed[0])
	})
	if err != nil {
		t.Fatalf("%s never allowed: %v", needed[0], err)
	}
	for _, a := range needed {
		if ok, err := allowed(a); err != nil || !ok {
			t.Errorf("%s: allowed %v, error %v; the informers need it", a, ok, err)
		}
	}

	var denied []access
	for _, r := range []struct{ group, resource string }{
		{"", "services"}, {"discovery.k8s.io", "endpointslices"}, {"", "nodes"}, {"networking.k8s.io", "servicecidrs"},
	} {
		for _, verb := range []string{"create", "update", "patch", "delete", "deletecollection"} {
			denied = append(denied, access{verb: verb, group: r.group, resource: r.resource})
		}
	}
	denied = append(denied,
		access{verb: "update", resource: "services", subresource: "status"},
		access{verb: "patch", resource: "nodes", subresource: "status"},
		access{verb: "get", resource: "secrets"},
		access{verb: "list", resource: "secrets"},
		access{verb: "list", resource: "pods"},
		access{verb: "create", resource: "pods"},
		access{verb: "create", resource: "pods", subresource: "exec"},
		access{verb: "list", resource: "configmaps"},
		access{verb: "list", resource: "endpoints"},
		access{verb: "create", resource: "events"},
		access{verb: "create", group: "events.k8s.io", resource: "events"},
		access{verb: "create", group: "coordination.k8s.io", resource: "leases"},
		access{verb: "create", resource: "serviceaccounts", subresource: "token"},
		access{verb: "list", group: "apps", resource: "daemonsets"},
		access{verb: "update", group: "apps", resource: "daemonsets"},
		access{verb: "bind", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		access{verb: "escalate", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		access{verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterrolebindings"},
		access{verb: "impersonate", resource: "users"},
		access{verb: "*", group: "*", resource: "*"},
	)
	for _, a := range denied {
		if ok, err := allowed(a); err != nil || ok {
			t.Errorf("%s: allowed %v, error %v; nftproxy only reads", a, ok, err)
		}
	}
}
