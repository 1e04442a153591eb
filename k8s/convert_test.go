package k8s

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// svc builds a valid ClusterIP service with one port "http" 80/TCP; mods
// change it.
func svc(ns, name string, mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func withPorts(ports ...v1.ServicePort) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

func withClusterIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func basePort(ns, name, port string, proto Protocol, num uint16) ServicePort {
	return ServicePort{
		Name:       ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: proto},
		ClusterIPs: addrs("10.96.0.10"),
		Port:       num,
	}
}

func TestServicePorts(t *testing.T) {
	tests := []struct {
		name string
		svc  *v1.Service
		want []ServicePort
		// errs are the sentinel reasons expected, in order; each error must
		// also name the service and the field.
		errs   []error
		fields []string
	}{
		{
			name: "valid",
			svc:  svc("default", "web"),
			want: []ServicePort{basePort("default", "web", "http", TCP, 80)},
		},
		{
			name: "defaults of an object that never met an API server",
			svc: svc("default", "web", func(s *v1.Service) {
				s.Spec.Type = ""
				s.Spec.ClusterIPs = nil
				s.Spec.Ports = []v1.ServicePort{{Port: 53}}
			}),
			want: []ServicePort{basePort("default", "web", "", TCP, 53)},
		},
		{
			name: "ports sorted by name and protocol",
			svc: svc("ns", "dns", withPorts(
				v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
				v1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "a", Port: 9153, Protocol: v1.ProtocolSCTP},
			)),
			want: []ServicePort{
				basePort("ns", "dns", "a", SCTP, 9153),
				basePort("ns", "dns", "dns", UDP, 53),
				basePort("ns", "dns", "dns-tcp", TCP, 53),
			},
		},
		{
			name: "ExternalName is ignored",
			svc:  svc("default", "ext", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName; s.Spec.ClusterIPs = nil }),
		},
		{
			name: "headless by clusterIP None is ignored",
			svc:  svc("default", "hl", withClusterIPs("None")),
		},
		{
			name: "headless by label is ignored",
			svc:  svc("default", "hl", func(s *v1.Service) { s.Labels = map[string]string{v1.IsHeadlessService: ""} }),
		},
		{
			name: "another proxy's service is ignored",
			svc:  svc("default", "other", func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "x"} }),
		},
		{
			name:   "invalid cluster IP skips the service",
			svc:    svc("default", "web", withClusterIPs("10.96.0.300")),
			errs:   []error{ErrInvalidIP},
			fields: []string{"spec.clusterIPs[0]"},
		},
		{
			name:   "mapped IPv4 cluster IP is refused",
			svc:    svc("default", "web", withClusterIPs("::ffff:10.96.0.1")),
			errs:   []error{ErrInvalidIP},
			fields: []string{"spec.clusterIPs[0]"},
		},
		{
			name:   "missing cluster IP skips the service",
			svc:    svc("default", "web", withClusterIPs()),
			errs:   []error{ErrMissingField},
			fields: []string{"spec.clusterIP"},
		},
		{
			name:   "two cluster IPs of one family",
			svc:    svc("default", "web", withClusterIPs("10.96.0.10", "10.96.0.11")),
			errs:   []error{ErrInvalidValue},
			fields: []string{"spec.clusterIPs[1]"},
		},
		{
			name: "invalid external IP skips the service",
			svc: svc("default", "web", func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "not-an-ip"}
			}),
			errs:   []error{ErrInvalidIP},
			fields: []string{"spec.externalIPs[1]"},
		},
		{
			name:   "loopback external IP",
			svc:    svc("default", "web", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"127.0.0.1"} }),
			errs:   []error{ErrInvalidIP},
			fields: []string{"spec.externalIPs[0]"},
		},
		{
			name: "invalid load-balancer IP skips the service",
			svc: svc("default", "lb", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "1.2.3"}}
			}),
			errs:   []error{ErrInvalidIP},
			fields: []string{"status.loadBalancer.ingress[0].ip"},
		},
		{
			name:   "invalid source range",
			svc:    svc("default", "web", func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"} }),
			errs:   []error{ErrInvalidPrefix},
			fields: []string{"spec.loadBalancerSourceRanges[0]"},
		},
		{
			name:   "name too long",
			svc:    svc("default", strings.Repeat("a", 64)),
			errs:   []error{ErrNameTooLong},
			fields: []string{"metadata.name"},
		},
		{
			name:   "name not a DNS-1035 label",
			svc:    svc("default", "1web"),
			errs:   []error{ErrInvalidName},
			fields: []string{"metadata.name"},
		},
		{
			name:   "missing namespace",
			svc:    svc("", "web"),
			errs:   []error{ErrMissingField},
			fields: []string{"metadata.namespace"},
		},
		{
			name:   "no ports",
			svc:    svc("default", "web", withPorts()),
			errs:   []error{ErrMissingField},
			fields: []string{"spec.ports"},
		},
		{
			name:   "unknown type",
			svc:    svc("default", "web", func(s *v1.Service) { s.Spec.Type = "Magic" }),
			errs:   []error{ErrInvalidValue},
			fields: []string{"spec.type"},
		},
		{
			name: "port 0 skips the port only",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: "bad", Port: 0},
				v1.ServicePort{Name: "http", Port: 80},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrPortRange},
			fields: []string{"spec.ports[0].port"},
		},
		{
			name: "port above 65535",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "big", Port: 65536},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrPortRange},
			fields: []string{"spec.ports[1].port"},
		},
		{
			name: "unknown protocol skips the port only",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "quic", Port: 443, Protocol: "QUIC"},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrUnknownProtocol},
			fields: []string{"spec.ports[1].protocol"},
		},
		{
			name: "port name too long",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: strings.Repeat("p", 64), Port: 81},
				v1.ServicePort{Name: "http", Port: 80},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrNameTooLong},
			fields: []string{"spec.ports[0].name"},
		},
		{
			name: "unnamed port of a multi-port service",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Port: 81},
				v1.ServicePort{Name: "http", Port: 80},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrMissingField},
			fields: []string{"spec.ports[0].name"},
		},
		{
			name: "duplicate port number",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "http2", Port: 80},
			)),
			want:   []ServicePort{basePort("default", "web", "http", TCP, 80)},
			errs:   []error{ErrDuplicate},
			fields: []string{"spec.ports[1]"},
		},
		{
			name: "nodePort out of range",
			svc: svc("default", "np", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{{Name: "a", Port: 80, NodePort: 70000}, {Name: "b", Port: 81, NodePort: 30081}}
			}),
			want: []ServicePort{func() ServicePort {
				sp := basePort("default", "np", "b", TCP, 81)
				sp.NodePort = 30081
				return sp
			}()},
			errs:   []error{ErrPortRange},
			fields: []string{"spec.ports[0].nodePort"},
		},
		{
			name: "nodePort on a ClusterIP service",
			svc: svc("default", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80, NodePort: 30080},
			)),
			errs:   []error{ErrInvalidValue},
			fields: []string{"spec.ports[0].nodePort"},
		},
		{
			name:   "bad affinity timeout",
			svc:    svc("default", "web", withAffinity(ptr[int32](0))),
			errs:   []error{ErrInvalidValue},
			fields: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
		},
		{
			name: "every service-wide problem is reported",
			svc: svc("default", "web", withClusterIPs("bad"), func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"also-bad"}
			}),
			errs:   []error{ErrInvalidIP, ErrInvalidIP},
			fields: []string{"spec.clusterIPs[0]", "spec.externalIPs[0]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := ServicePorts(tt.svc)
			if diff := cmp.Diff(tt.want, got, cmpAddrs); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			checkErrs(t, errs, strings.TrimPrefix(tt.svc.Namespace+"/"+tt.svc.Name, "/"), tt.errs, tt.fields)
		})
	}
}

// checkErrs checks that errs are ObjectErrors naming obj, with the given
// reasons and fields in order.
func checkErrs(t *testing.T, errs []error, obj string, reasons []error, fields []string) {
	t.Helper()
	if len(errs) != len(reasons) {
		t.Fatalf("got %d errors %v, want %d (%v)", len(errs), errs, len(reasons), reasons)
	}
	for i, err := range errs {
		if !errors.Is(err, reasons[i]) {
			t.Errorf("error %d = %v, want %v", i, err, reasons[i])
		}
		var oe *ObjectError
		if !errors.As(err, &oe) {
			t.Errorf("error %d = %T, want *ObjectError", i, err)
			continue
		}
		if !strings.Contains(err.Error(), obj) || !strings.Contains(err.Error(), fields[i]) {
			t.Errorf("error %d = %q does not name %q and %q", i, err, obj, fields[i])
		}
		if oe.Field != fields[i] {
			t.Errorf("error %d field = %q, want %q", i, oe.Field, fields[i])
		}
	}
}

var cmpAddrs = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func withAffinity(timeout *int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if timeout != nil {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: timeout}}
		}
	}
}

func TestServicePortsFields(t *testing.T) {
	local := v1.ServiceInternalTrafficPolicyLocal
	proxyMode := v1.LoadBalancerIPModeProxy
	tests := []struct {
		name string
		svc  *v1.Service
		want ServicePort
	}{
		{
			name: "dual-stack cluster IPs from clusterIPs, sorted",
			svc:  svc("default", "web", withClusterIPs("fd00::10", "10.96.0.10")),
			want: ServicePort{ClusterIPs: addrs("10.96.0.10", "fd00::10")},
		},
		{
			name: "clusterIP alone when clusterIPs is empty",
			svc:  svc("default", "web", func(s *v1.Service) { s.Spec.ClusterIPs = nil; s.Spec.ClusterIP = "10.96.0.20" }),
			want: ServicePort{ClusterIPs: addrs("10.96.0.20")},
		},
		{
			name: "affinity default timeout",
			svc:  svc("default", "web", withAffinity(nil)),
			want: ServicePort{ClusterIPs: addrs("10.96.0.10"), AffinityTimeout: 10800 * time.Second},
		},
		{
			name: "affinity timeout",
			svc:  svc("default", "web", withAffinity(ptr[int32](60))),
			want: ServicePort{ClusterIPs: addrs("10.96.0.10"), AffinityTimeout: time.Minute},
		},
		{
			name: "external policy Local on a ClusterIP service without external IPs means nothing",
			svc: svc("default", "web", func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.InternalTrafficPolicy = &local
			}),
			want: ServicePort{ClusterIPs: addrs("10.96.0.10"), InternalPolicyLocal: true},
		},
		{
			name: "external policy Local with external IPs",
			svc: svc("default", "web", func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.ExternalIPs = []string{"192.0.2.9", "192.0.2.1", "192.0.2.9"}
			}),
			want: ServicePort{ClusterIPs: addrs("10.96.0.10"), ExternalIPs: addrs("192.0.2.1", "192.0.2.9"), ExternalPolicyLocal: true},
		},
		{
			name: "load balancer",
			svc: svc("default", "web", func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.7/24", "2001:db8::/32"}
				s.Spec.TrafficDistribution = ptr("PreferClose")
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "198.51.100.1"}, {Hostname: "lb.example"}, {IP: "198.51.100.2", IPMode: &proxyMode},
				}
			}),
			want: ServicePort{
				ClusterIPs:               addrs("10.96.0.10"),
				LoadBalancerIPs:          addrs("198.51.100.1"),
				LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")},
				ExternalPolicyLocal:      true,
				HealthCheckNodePort:      32000,
				TrafficDistribution:      "PreferClose",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := ServicePorts(tt.svc)
			if len(errs) > 0 || len(got) != 1 {
				t.Fatalf("got %d ports, errors %v", len(got), errs)
			}
			tt.want.Name = ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: TCP}
			tt.want.Port = 80
			if diff := cmp.Diff(tt.want, got[0], cmpAddrs, cmpPrefixes); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

var cmpPrefixes = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

// slice builds an EndpointSlice of service ns/svc with one port "http" 8080
// and the given endpoints.
func slice(ns, name, service string, at discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: at,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)}},
	}
	return s
}

func ep(addr string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, m := range mods {
		m(&e)
	}
	return e
}

func notReady(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr(false) }

func terminating(serving bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(serving), Terminating: ptr(true)}
	}
}

func endpoint(addr string, port uint16) Endpoint {
	return Endpoint{Addr: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true}
}

func TestEndpointsFromSlice(t *testing.T) {
	tests := []struct {
		name   string
		slice  *discoveryv1.EndpointSlice
		want   *SliceEndpoints
		errs   []error
		fields []string
	}{
		{
			name: "conditions, topology and sorting",
			slice: slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4,
				ep("10.244.0.3", func(e *discoveryv1.Endpoint) {
					e.NodeName = ptr("node-a")
					e.Zone = ptr("z1")
					e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "node-a"}}}
				}),
				ep("10.244.0.2", notReady),
				ep("10.244.0.1", terminating(true)),
				ep("10.244.0.4", func(e *discoveryv1.Endpoint) { e.Conditions.Serving = ptr(false) }),
			),
			want: &SliceEndpoints{Namespace: "default", Name: "web-1", Service: "web", Ports: []PortEndpoints{{
				Name: "http", Protocol: TCP, Endpoints: []Endpoint{
					{Addr: netip.MustParseAddr("10.244.0.1"), Port: 8080, Serving: true, Terminating: true},
					{Addr: netip.MustParseAddr("10.244.0.2"), Port: 8080},
					{Addr: netip.MustParseAddr("10.244.0.3"), Port: 8080, Ready: true, Serving: true,
						NodeName: "node-a", Zone: "z1", Hints: &Hints{Zones: []string{"z1"}, Nodes: []string{"node-a"}}},
					{Addr: netip.MustParseAddr("10.244.0.4"), Port: 8080, Ready: true},
				},
			}}},
		},
		{
			name:  "FQDN slices are ignored",
			slice: slice("default", "web-1", "web", discoveryv1.AddressTypeFQDN, ep("example.com")),
		},
		{
			name: "headless slices are ignored",
			slice: func() *discoveryv1.EndpointSlice {
				s := slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4, ep("10.244.0.1"))
				s.Labels[v1.IsHeadlessService] = ""
				return s
			}(),
		},
		{
			name: "missing service-name label skips the slice",
			slice: func() *discoveryv1.EndpointSlice {
				s := slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4, ep("10.244.0.1"))
				s.Labels = nil
				return s
			}(),
			errs:   []error{ErrMissingField},
			fields: []string{"metadata.labels"},
		},
		{
			name:   "unknown address type skips the slice",
			slice:  slice("default", "web-1", "web", "IPX", ep("10.244.0.1")),
			errs:   []error{ErrInvalidValue},
			fields: []string{"addressType"},
		},
		{
			name: "bad addresses skip those endpoints",
			slice: slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4,
				ep("10.244.0.1"), ep("10.244.0.999"), ep("fd00::1"), ep("127.0.0.1"), discoveryv1.Endpoint{}),
			want: &SliceEndpoints{Namespace: "default", Name: "web-1", Service: "web", Ports: []PortEndpoints{{
				Name: "http", Protocol: TCP, Endpoints: []Endpoint{endpoint("10.244.0.1", 8080)},
			}}},
			errs:   []error{ErrInvalidIP, ErrInvalidIP, ErrInvalidIP, ErrMissingField},
			fields: []string{"endpoints[1].addresses[0]", "endpoints[2].addresses[0]", "endpoints[3].addresses[0]", "endpoints[4].addresses"},
		},
		{
			name: "bad ports skip those ports",
			slice: func() *discoveryv1.EndpointSlice {
				s := slice("default", "web-1", "web", discoveryv1.AddressTypeIPv6, ep("fd00::1"))
				s.Ports = append(s.Ports,
					discoveryv1.EndpointPort{Name: ptr("zero"), Port: ptr[int32](0)},
					discoveryv1.EndpointPort{Name: ptr("nil")},
					discoveryv1.EndpointPort{Name: ptr("proto"), Port: ptr[int32](1), Protocol: ptr[v1.Protocol]("ICMP")},
					discoveryv1.EndpointPort{Name: ptr(strings.Repeat("n", 64)), Port: ptr[int32](2)},
					discoveryv1.EndpointPort{Name: ptr("http"), Port: ptr[int32](9)},
					discoveryv1.EndpointPort{Port: ptr[int32](53), Protocol: ptr(v1.ProtocolUDP)},
				)
				return s
			}(),
			want: &SliceEndpoints{Namespace: "default", Name: "web-1", Service: "web", Ports: []PortEndpoints{
				{Name: "", Protocol: UDP, Endpoints: []Endpoint{endpoint("fd00::1", 53)}},
				{Name: "http", Protocol: TCP, Endpoints: []Endpoint{endpoint("fd00::1", 8080)}},
			}},
			errs:   []error{ErrPortRange, ErrMissingField, ErrUnknownProtocol, ErrNameTooLong, ErrDuplicate},
			fields: []string{"ports[1].port", "ports[2].port", "ports[3].protocol", "ports[4].name", "ports[5]"},
		},
		{
			name: "duplicate addresses in a slice keep the best conditions",
			slice: slice("default", "web-1", "web", discoveryv1.AddressTypeIPv4,
				ep("10.244.0.1", notReady), ep("10.244.0.1")),
			want: &SliceEndpoints{Namespace: "default", Name: "web-1", Service: "web", Ports: []PortEndpoints{{
				Name: "http", Protocol: TCP, Endpoints: []Endpoint{endpoint("10.244.0.1", 8080)},
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := EndpointsFromSlice(tt.slice)
			if diff := cmp.Diff(tt.want, got, cmpAddrs); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			checkErrs(t, errs, tt.slice.Namespace+"/"+tt.slice.Name, tt.errs, tt.fields)
		})
	}
}

func TestWithEndpoints(t *testing.T) {
	ports := []ServicePort{
		basePort("default", "web", "http", TCP, 80),
		basePort("default", "web", "metrics", TCP, 9090),
	}
	ready := endpoint("10.244.0.1", 8080)
	unready := ready
	unready.Ready, unready.Serving = false, false
	from := []*SliceEndpoints{
		{Namespace: "default", Service: "web", Name: "a", Ports: []PortEndpoints{
			{Name: "http", Protocol: TCP, Endpoints: []Endpoint{unready, endpoint("10.244.0.2", 8080)}},
			{Name: "http", Protocol: UDP, Endpoints: []Endpoint{endpoint("10.244.0.9", 8080)}},
		}},
		{Namespace: "default", Service: "web", Name: "b", Ports: []PortEndpoints{
			{Name: "http", Protocol: TCP, Endpoints: []Endpoint{endpoint("fd00::1", 8080), ready}},
		}},
		{Namespace: "other", Service: "web", Name: "c", Ports: []PortEndpoints{
			{Name: "http", Protocol: TCP, Endpoints: []Endpoint{endpoint("10.244.9.9", 8080)}},
		}},
	}
	got := WithEndpoints(ports, from)
	want := []ServicePort{ports[0], ports[1]}
	want[0].Endpoints = []Endpoint{ready, endpoint("10.244.0.2", 8080), endpoint("fd00::1", 8080)}
	if diff := cmp.Diff(want, got, cmpAddrs); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if ports[0].Endpoints != nil {
		t.Error("WithEndpoints modified its input")
	}
}

func TestNodeFrom(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1", "role": "x"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeExternalIP, Address: "203.0.113.5"},
			{Type: v1.NodeHostName, Address: "node-a"},
			{Type: v1.NodeInternalIP, Address: "192.168.1.5"},
			{Type: v1.NodeInternalIP, Address: "fd00::5"},
			{Type: v1.NodeInternalIP, Address: "bogus"},
			{Type: v1.NodeExternalIP, Address: "192.168.1.5"},
		}},
	}
	got, errs := NodeFrom(node)
	want := Node{Name: "node-a", Zone: "z1", Addrs: addrs("192.168.1.5", "fd00::5", "203.0.113.5"),
		Labels: map[string]string{v1.LabelTopologyZone: "z1", "role": "x"}}
	if diff := cmp.Diff(want, got, cmpAddrs); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if !got.Eligible() {
		t.Error("a node neither deleted nor tainted is not eligible")
	}

	// What drains a node (KEP-3836): a deletionTimestamp, or the autoscaler's taint.
	deleting := node.DeepCopy()
	when := metav1.NewTime(time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC))
	deleting.DeletionTimestamp = &when
	if n, _ := NodeFrom(deleting); !n.Deleting.Equal(when.Time) || n.Eligible() {
		t.Errorf("node with deletionTimestamp %s: Deleting %s, Eligible %v", when, n.Deleting, n.Eligible())
	}
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []v1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: v1.TaintEffectNoSchedule}}
	if n, _ := NodeFrom(tainted); !n.Eligible() {
		t.Error("a cordoned node is not eligible; only the autoscaler's taint drains")
	}
	tainted.Spec.Taints = append(tainted.Spec.Taints, v1.Taint{Key: TaintToBeDeleted, Value: "1764000000", Effect: v1.TaintEffectNoSchedule})
	n, _ := NodeFrom(tainted)
	wantTaints := []Taint{{Key: "node.kubernetes.io/unschedulable", Effect: "NoSchedule"}, {Key: TaintToBeDeleted, Value: "1764000000", Effect: "NoSchedule"}}
	if diff := cmp.Diff(wantTaints, n.Taints); diff != "" || n.Eligible() {
		t.Errorf("taints (-want +got):\n%s; Eligible %v", diff, n.Eligible())
	}
	checkErrs(t, errs, "node-a", []error{ErrInvalidIP}, []string{"status.addresses[4]"})
	node.Labels["role"] = "changed"
	if got.Labels["role"] != "x" {
		t.Error("NodeFrom shares the node's label map")
	}
}

func TestMergeEndpoints(t *testing.T) {
	e := func(a string, port uint16, ready bool, node string) Endpoint {
		return Endpoint{Addr: netip.MustParseAddr(a), Port: port, Ready: ready, Serving: ready, NodeName: node}
	}
	tests := []struct {
		name    string
		in, out []Endpoint
	}{
		{"none", nil, nil},
		{"sorted, kept as is", []Endpoint{e("10.0.0.1", 80, true, "a"), e("10.0.0.1", 81, true, "a"), e("10.0.0.2", 80, true, "a")},
			[]Endpoint{e("10.0.0.1", 80, true, "a"), e("10.0.0.1", 81, true, "a"), e("10.0.0.2", 80, true, "a")}},
		{"unsorted", []Endpoint{e("10.0.0.3", 80, true, "a"), e("10.0.0.1", 80, false, "a"), e("10.0.0.2", 80, true, "a")},
			[]Endpoint{e("10.0.0.1", 80, false, "a"), e("10.0.0.2", 80, true, "a"), e("10.0.0.3", 80, true, "a")}},
		{"twice: the better conditions win", []Endpoint{e("10.0.0.1", 80, false, "a"), e("10.0.0.1", 80, true, "b")},
			[]Endpoint{e("10.0.0.1", 80, true, "b")}},
		{"twice, as good: the earlier wins", []Endpoint{e("10.0.0.2", 80, true, "a"), e("10.0.0.1", 80, true, "b"), e("10.0.0.1", 80, true, "c")},
			[]Endpoint{e("10.0.0.1", 80, true, "b"), e("10.0.0.2", 80, true, "a")}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.out, mergeEndpoints(tt.in), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}
