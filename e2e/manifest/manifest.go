package manifest

import (
	"fmt"
	"strings"
)

// Service is a Service with one port and the one EndpointSlice of its
// endpoints.
type Service struct {
	Namespace, Name string
	ClusterIP       string
	Proto           string // TCP, UDP or SCTP
	PortName        string
	Port            int
	TargetPort      int // also the slice's port
	NodePort        int // 0: a ClusterIP service
	// ExtraSpec is more YAML under spec, each line indented by two spaces
	// and ending in a newline.
	ExtraSpec string
	Slice     string // the EndpointSlice's name
	ManagedBy string // its endpointslice.kubernetes.io/managed-by
	Endpoints []string
	// Endpoint is the YAML after each endpoint's addresses line (its
	// conditions, its node…), each line indented by two spaces and ending
	// in a newline.
	Endpoint string
}

// YAML returns the Service and its EndpointSlice as two YAML documents.
func (s Service) YAML() string {
	typ, np := "ClusterIP", ""
	if s.NodePort != 0 {
		typ, np = "NodePort", fmt.Sprintf("\n    nodePort: %d", s.NodePort)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  type: %[3]s
  clusterIP: %[4]s
  clusterIPs: [%[4]s]
  ports:
  - name: %[5]s
    protocol: %[6]s
    port: %[7]d
    targetPort: %[8]d%[9]s
%[10]s---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[11]s
  namespace: %[2]s
  labels:
    kubernetes.io/service-name: %[1]s
    endpointslice.kubernetes.io/managed-by: %[12]s
addressType: IPv4
ports:
- name: %[5]s
  protocol: %[6]s
  port: %[8]d
endpoints:
`, s.Name, s.Namespace, typ, s.ClusterIP, s.PortName, s.Proto, s.Port, s.TargetPort, np, s.ExtraSpec, s.Slice, s.ManagedBy)
	if len(s.Endpoints) == 0 {
		return strings.TrimSuffix(b.String(), "\n") + " []\n"
	}
	for _, a := range s.Endpoints {
		fmt.Fprintf(&b, "- addresses: [%s]\n%s", a, s.Endpoint)
	}
	return b.String()
}
