package manifest

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestYAML checks that both documents decode and name what they should.
func TestYAML(t *testing.T) {
	s := Service{Namespace: "default", Name: "web", ClusterIP: "10.96.0.10", Proto: "TCP", PortName: "http",
		Port: 80, TargetPort: 8080, NodePort: 30080, Slice: "web-1", ManagedBy: "e2e",
		Endpoints: []string{"10.244.1.10", "10.244.1.11"}, Endpoint: "  conditions: {ready: true}\n  nodeName: node-1\n"}
	docs := strings.SplitN(s.YAML(), "---\n", 2)
	if len(docs) != 2 {
		t.Fatalf("%d documents:\n%s", len(docs), s.YAML())
	}
	var svc struct {
		Spec struct {
			Type  string
			Ports []struct{ NodePort, TargetPort int }
		}
	}
	if err := yaml.Unmarshal([]byte(docs[0]), &svc); err != nil || svc.Spec.Type != "NodePort" || svc.Spec.Ports[0].NodePort != 30080 {
		t.Errorf("service: %+v, %v", svc, err)
	}
	var es struct {
		Metadata  struct{ Labels map[string]string }
		Endpoints []struct {
			Addresses []string
			NodeName  string `json:"nodeName"`
		}
	}
	if err := yaml.Unmarshal([]byte(docs[1]), &es); err != nil || len(es.Endpoints) != 2 || es.Endpoints[1].NodeName != "node-1" ||
		es.Metadata.Labels["kubernetes.io/service-name"] != "web" {
		t.Errorf("slice: %+v, %v", es, err)
	}
	s.Endpoints = nil
	if err := yaml.Unmarshal([]byte(strings.SplitN(s.YAML(), "---\n", 2)[1]), &es); err != nil || len(es.Endpoints) != 0 {
		t.Errorf("no endpoints: %+v, %v", es, err)
	}
}
