package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
)

// manifest is one YAML document of a file under deploy/.
type manifest struct {
	file string // relative to deploy/
	doc  int    // 0-based index among the file's non-empty documents
	json []byte
	obj  runtime.Object // decoded strictly into client-go's typed objects
}

func (m manifest) String() string {
	return fmt.Sprintf("%s#%d", m.file, m.doc)
}

// kustomization is the part of kustomization.yaml the tests check.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

const kustomizationFile = "kustomization.yaml"

// manifestFiles lists the Kubernetes manifests: every YAML file here and in
// examples/, except kustomize's own file.
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"*.yaml", "examples/*.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if f != kustomizationFile {
				out = append(out, f)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no manifests found")
	}
	return out
}

// loadManifests splits every manifest file into documents and decodes each
// strictly: an unknown or duplicate field fails, as kubectl's strict field
// validation would.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	codecs := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	var out []manifest
	for _, file := range manifestFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for doc := 0; ; {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: split documents: %v", file, err)
			}
			j, err := yaml.YAMLToJSONStrict(raw)
			if err != nil {
				t.Fatalf("%s: document %d: %v", file, doc, err)
			}
			if string(bytes.TrimSpace(j)) == "null" {
				continue // only comments
			}
			m := manifest{file: file, doc: doc, json: j}
			if m.obj, _, err = codecs.UniversalDeserializer().Decode(j, nil, nil); err != nil {
				t.Errorf("%s: decode: %v", m, err)
				continue
			}
			out = append(out, m)
			doc++
		}
	}
	return out
}

func kindsByFile(ms []manifest) map[string][]string {
	out := map[string][]string{}
	for _, m := range ms {
		out[m.file] = append(out[m.file], m.obj.GetObjectKind().GroupVersionKind().Kind)
	}
	return out
}

func TestManifestsDecode(t *testing.T) {
	ms := loadManifests(t)
	got := kindsByFile(ms)
	tests := []struct {
		file  string
		kinds []string
	}{
		{"serviceaccount.yaml", []string{"ServiceAccount"}},
		{"rbac.yaml", []string{"ClusterRole", "ClusterRoleBinding"}},
		{"configmap.yaml", []string{"ConfigMap"}},
		{"daemonset.yaml", []string{"DaemonSet"}},
		{"examples/web.yaml", []string{"Service", "EndpointSlice"}},
		{"examples/dns.yaml", []string{"Service", "EndpointSlice"}},
		{"examples/empty.yaml", []string{"Service"}},
		{"examples/node.yaml", []string{"Node"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			if diff := cmp.Diff(tt.kinds, got[tt.file]); diff != "" {
				t.Errorf("kinds (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	data, err := os.ReadFile(kustomizationFile)
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("parse %s: %v", kustomizationFile, err)
	}
	if k.Kind != "Kustomization" {
		t.Errorf("kind %q, want Kustomization", k.Kind)
	}
	var top []string
	for _, f := range manifestFiles(t) {
		if !strings.Contains(f, "/") {
			top = append(top, f)
		}
	}
	if diff := cmp.Diff(top, slices.Sorted(slices.Values(k.Resources))); diff != "" {
		t.Errorf("resources (-files +kustomization):\n%s", diff)
	}
	// Namespaced objects already carry the namespace kustomize would set, so
	// kubectl apply -f deploy/ means the same as kubectl apply -k deploy/.
	for _, m := range loadManifests(t) {
		if strings.Contains(m.file, "/") {
			continue
		}
		o, err := meta.Accessor(m.obj)
		if err != nil {
			t.Fatal(err)
		}
		if ns := o.GetNamespace(); ns != "" && ns != k.Namespace {
			t.Errorf("%s: namespace %q, kustomization sets %q", m, ns, k.Namespace)
		}
	}
}

// find returns the only object of type T among ms.
func find[T runtime.Object](t *testing.T, ms []manifest) T {
	t.Helper()
	var found []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok && !strings.Contains(m.file, "/") {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T in deploy/, found %d", zero, len(found))
	}
	return found[0]
}

// TestManifestsAgree checks the references between the manifests: names,
// the config file path and the permissions the informers need.
func TestManifestsAgree(t *testing.T) {
	ms := loadManifests(t)
	sa := find[*v1.ServiceAccount](t, ms)
	role := find[*rbacv1.ClusterRole](t, ms)
	binding := find[*rbacv1.ClusterRoleBinding](t, ms)
	cm := find[*v1.ConfigMap](t, ms)
	ds := find[*appsv1.DaemonSet](t, ms)
	pod := ds.Spec.Template.Spec

	if pod.ServiceAccountName != sa.Name {
		t.Errorf("DaemonSet runs as %q, the ServiceAccount is %q", pod.ServiceAccountName, sa.Name)
	}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		t.Errorf("binding refers to %s %q, the role is %q", binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
	}
	wantSubject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}
	if !slices.Contains(binding.Subjects, wantSubject) {
		t.Errorf("binding subjects %v lack %v", binding.Subjects, wantSubject)
	}
	// What RunInformers lists and watches.
	for _, need := range []struct{ group, resource string }{{"", "services"}, {"", "nodes"}, {"discovery.k8s.io", "endpointslices"}} {
		for _, verb := range []string{"list", "watch"} {
			if !allows(role.Rules, need.group, need.resource, verb) {
				t.Errorf("ClusterRole does not allow %s on %s.%s", verb, need.resource, need.group)
			}
		}
	}
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("ClusterRole grants %q; nftproxy only reads", v)
			}
		}
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	var configPath string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = p
		}
	}
	var mountedFrom string
	for _, vm := range c.VolumeMounts {
		if strings.HasPrefix(configPath, vm.MountPath+"/") {
			for _, vol := range pod.Volumes {
				if vol.Name == vm.Name && vol.ConfigMap != nil {
					mountedFrom = vol.ConfigMap.Name
				}
			}
		}
	}
	if mountedFrom != cm.Name {
		t.Errorf("--config=%q is not in a volume of ConfigMap %q", configPath, cm.Name)
	}
	var cfg struct {
		Kind               string `json:"kind"`
		HealthzBindAddress string `json:"healthzBindAddress"`
	}
	key := filepath.Base(configPath)
	if err := yaml.Unmarshal([]byte(cm.Data[key]), &cfg); err != nil || cfg.Kind != "KubeProxyConfiguration" {
		t.Errorf("ConfigMap key %q: kind %q, error %v; want a KubeProxyConfiguration", key, cfg.Kind, err)
	}
	for name, probe := range map[string]*v1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			continue
		}
		if _, port, _ := strings.Cut(cfg.HealthzBindAddress, ":"); port != probe.HTTPGet.Port.String() {
			t.Errorf("%s probe on port %s, healthz listens on %q", name, probe.HTTPGet.Port.String(), cfg.HealthzBindAddress)
		}
	}
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestManifestsServerDryRun sends every manifest to a real kube-apiserver as
// a server-side dry-run create with strict field validation: defaulting,
// validation and admission run as for kubectl apply, nothing is stored.
func TestManifestsServerDryRun(t *testing.T) {
	srv := apiserver.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	api := newDynamicAPI(t, srv)
	waitForNamespaces(ctx, t, srv, metav1.NamespaceSystem, metav1.NamespaceDefault)

	for _, m := range loadManifests(t) {
		t.Run(m.String(), func(t *testing.T) {
			var u unstructured.Unstructured
			if err := u.UnmarshalJSON(m.json); err != nil {
				t.Fatal(err)
			}
			gvk := u.GroupVersionKind()
			ri := api.resource(t, &u, metav1.NamespaceDefault)
			opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
			if _, err := ri.Create(ctx, &u, opts); err != nil {
				t.Errorf("server-side dry run of %s %s: %v", gvk.Kind, u.GetName(), err)
			}
		})
	}

	// Dry run stored nothing.
	cs, err := kubernetes.NewForConfig(srv.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	dss, err := cs.AppsV1().DaemonSets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	if err != nil || len(dss.Items) != 0 {
		t.Errorf("after dry run: %d DaemonSets, error %v", len(dss.Items), err)
	}
}

// dynamicAPI creates and applies any kind of object the API server serves.
type dynamicAPI struct {
	mapper meta.RESTMapper
	dyn    *dynamic.DynamicClient
}

func newDynamicAPI(t *testing.T, srv *apiserver.Server) dynamicAPI {
	t.Helper()
	disc, err := discovery.NewDiscoveryClientForConfig(srv.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(disc)
	if err != nil {
		t.Fatalf("discover API resources: %v", err)
	}
	dyn, err := dynamic.NewForConfig(srv.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	return dynamicAPI{mapper: restmapper.NewDiscoveryRESTMapper(groups), dyn: dyn}
}

// resource returns the client of u's resource, in u's namespace (or
// defaultNS when u has none) if the resource is namespaced.
func (a dynamicAPI) resource(t testing.TB, u *unstructured.Unstructured, defaultNS string) dynamic.ResourceInterface {
	t.Helper()
	gvk := u.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("the server does not serve %s: %v", gvk, err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource)
	}
	ns := u.GetNamespace()
	if ns == "" {
		ns = defaultNS
	}
	return a.dyn.Resource(mapping.Resource).Namespace(ns)
}

// waitForNamespaces waits for the namespaces kube-apiserver creates itself
// shortly after it starts.
func waitForNamespaces(ctx context.Context, t *testing.T, srv *apiserver.Server, names ...string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(srv.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		for {
			_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("namespace %s never appeared: %v", name, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}
