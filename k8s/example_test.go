package k8s_test

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/k8s"
)

func ExampleTracker() {
	tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-a"}})
	tr.SetService(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{
			ClusterIP: "10.96.0.10",
			Ports:     []v1.ServicePort{{Name: "http", Port: 80}, {Name: "bad", Port: 0}},
		},
	})
	port := "http"
	tr.SetSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.2"}}, {Addresses: []string{"10.244.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &port, Port: new(int32(8080))}},
	})
	<-tr.Changed()
	snap := tr.Snapshot()
	for _, sp := range snap.Services {
		fmt.Println(sp.Name, sp.ClusterIPs, sp.Port)
		for _, e := range sp.Endpoints {
			fmt.Printf("  %s:%d ready=%v\n", e.Addr, e.Port, e.Ready)
		}
	}
	for _, problem := range tr.Skipped() {
		fmt.Println(problem)
	}
	// Output:
	// default/web:http [10.96.0.10] 80
	//   10.244.0.1:8080 ready=true
	//   10.244.0.2:8080 ready=true
	// Service default/web: spec.ports[1].port: port out of range: 0 not in 1-65535 (port "bad"/TCP skipped)
}
