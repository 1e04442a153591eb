package conntrack

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nftproxy/nftproxy/k8s"
)

var (
	ap   = netip.MustParseAddrPort
	addr = netip.MustParseAddr
)

// udp builds a UDP flow from client to vip, DNATed to ep ("" for no DNAT).
func udp(client, vip, ep string) Flow { return flow(protoUDP, client, vip, ep) }

func flow(proto uint8, client, vip, ep string) Flow {
	f := Flow{Proto: proto, OrigSrc: ap(client), OrigDst: ap(vip), ReplyDst: ap(client)}
	f.ReplySrc = f.OrigDst
	if ep != "" {
		f.ReplySrc = ap(ep)
	}
	return f
}

// ep is a ready endpoint.
func ep(a string, port uint16) k8s.Endpoint {
	return k8s.Endpoint{Addr: addr(a), Port: port, Ready: true, Serving: true}
}

// svc is a service port with one ClusterIP.
func svc(name string, proto k8s.Protocol, clusterIP string, port uint16, eps ...k8s.Endpoint) k8s.ServicePort {
	return k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "ns", Name: name, Protocol: proto},
		ClusterIPs: []netip.Addr{addr(clusterIP)},
		Port:       port,
		Endpoints:  eps,
	}
}

func snap(sps ...k8s.ServicePort) *k8s.Snapshot {
	return &k8s.Snapshot{Services: sps, Node: k8s.Node{Name: "node-a", Addrs: []netip.Addr{addr("192.168.0.10"), addr("fd00:1::10")}}}
}

func TestStale(t *testing.T) {
	dns := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.UDP, "10.96.0.10", 53, eps...) }
	dnsTCP := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.TCP, "10.96.0.10", 53, eps...) }
	dns6 := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns6", k8s.UDP, "fd00:96::10", 53, eps...) }
	withNodePort := func(sp k8s.ServicePort) k8s.ServicePort { sp.NodePort = 30053; return sp }
	withExternal := func(sp k8s.ServicePort) k8s.ServicePort {
		sp.ExternalIPs = []netip.Addr{addr("203.0.113.7")}
		sp.LoadBalancerIPs = []netip.Addr{addr("198.51.100.9")}
		return sp
	}
	e1, e2, e3 := ep("10.244.1.5", 5353), ep("10.244.2.6", 5353), ep("10.244.3.7", 5353)
	terminating := e1
	terminating.Ready, terminating.Terminating = false, true
	notReady := e1
	notReady.Ready, notReady.Serving = false, false
	sctp := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("sig", k8s.SCTP, "10.96.0.20", 3868, eps...) }

	tests := []struct {
		name       string
		prev, next *k8s.Snapshot
		localAddrs []netip.Addr
		flows      []Flow
		want       []Flow
	}{{
		name:  "removed endpoint",
		prev:  snap(dns(e1, e2)),
		next:  snap(dns(e2)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"), udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.2.6:5353")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "endpoint moved to another address",
		prev:  snap(dns(e1)),
		next:  snap(dns(e3)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "endpoint moved to another port",
		prev:  snap(dns(e1)),
		next:  snap(dns(ep("10.244.1.5", 53))),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "endpoint still serving",
		prev:  snap(dns(e1, e2)),
		next:  snap(dns(e1)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "terminating but serving endpoint keeps its flows",
		prev:  snap(dns(e1, e2)),
		next:  snap(dns(terminating, e2)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "endpoint that stopped serving",
		prev:  snap(dns(e1, e2)),
		next:  snap(dns(notReady, e2)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name:  "last endpoint removed",
		prev:  snap(dns(e1)),
		next:  snap(dns()),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name: "service removed: DNATed flows go, the address is nobody's any more",
		prev: snap(dns(e1)),
		next: snap(),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40001", "10.96.0.10:53", ""),
		},
		want: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name: "other protocol: TCP flows are never touched",
		prev: snap(dns(e1), dnsTCP(e1)),
		next: snap(dns(e2), dnsTCP(e2)),
		flows: []Flow{
			flow(protoTCP, "10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"),
			flow(protoTCP, "10.0.0.1:40001", "10.96.0.10:53", ""),
			flow(1, "10.0.0.1:0", "10.96.0.10:0", ""),
		},
	}, {
		name:  "other protocol: a UDP flow is not matched by a TCP service",
		prev:  snap(dnsTCP(e1)),
		next:  snap(dnsTCP(e2)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name: "other program's flows",
		prev: snap(dns(e1)),
		next: snap(dns(e2)),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.0.0.53:53", "10.244.1.5:5353"),  // someone else's DNAT
			udp("10.0.0.1:40001", "10.96.0.10:54", "10.244.1.5:5353"), // other port on the VIP
			udp("10.0.0.1:40002", "10.0.0.53:53", ""),
			udp("10.244.1.5:5353", "10.0.0.1:40003", ""), // the endpoint as a client
		},
	}, {
		name: "IPv6",
		prev: snap(dns6(ep("fd00:244::5", 5353), ep("fd00:244::6", 5353))),
		next: snap(dns6(ep("fd00:244::6", 5353))),
		flows: []Flow{
			udp("[fd00::1]:40000", "[fd00:96::10]:53", "[fd00:244::5]:5353"),
			udp("[fd00::1]:40001", "[fd00:96::10]:53", "[fd00:244::6]:5353"),
		},
		want: []Flow{udp("[fd00::1]:40000", "[fd00:96::10]:53", "[fd00:244::5]:5353")},
	}, {
		name: "IPv4-mapped addresses in the snapshot match 4-byte flows",
		prev: snap(svc("dns", k8s.UDP, "::ffff:10.96.0.10", 53, ep("::ffff:10.244.1.5", 5353), ep("::ffff:10.244.2.6", 5353))),
		next: snap(svc("dns", k8s.UDP, "::ffff:10.96.0.10", 53, ep("::ffff:10.244.2.6", 5353))),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.2.6:5353"),
		},
		want: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353")},
	}, {
		name: "first endpoints: flows that met a reject go",
		prev: snap(dns()),
		next: snap(dns(e1)),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.96.0.10:53", ""),
			udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.1.5:5353"),
		},
		want: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "")},
	}, {
		name:  "new service: flows that predate it go",
		prev:  snap(),
		next:  snap(dns(e1)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "")},
		want:  []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "")},
	}, {
		name:  "undNATed flow when endpoints existed before stays",
		prev:  snap(dns(e1)),
		next:  snap(dns(e1, e2)),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "")},
	}, {
		name:  "still no endpoints: nothing to redirect to",
		prev:  snap(dns()),
		next:  snap(dns()),
		flows: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", "")},
	}, {
		name: "unknown prev (first sync): any wrong flow goes",
		prev: nil,
		next: snap(dns(e1)),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.96.0.10:53", ""),
			udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.9.9:5353"),
			udp("10.0.0.1:40002", "10.96.0.10:53", "10.244.1.5:5353"),
		},
		want: []Flow{udp("10.0.0.1:40000", "10.96.0.10:53", ""), udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.9.9:5353")},
	}, {
		name:       "NodePort on node addresses and extra local addresses",
		prev:       snap(withNodePort(dns(e1))),
		next:       snap(withNodePort(dns(e2))),
		localAddrs: []netip.Addr{addr("172.17.0.1")},
		flows: []Flow{
			udp("10.0.0.1:40000", "192.168.0.10:30053", "10.244.1.5:5353"),
			udp("[fd00::1]:40000", "[fd00:1::10]:30053", "[fd00:244::5]:5353"),
			udp("10.0.0.1:40001", "172.17.0.1:30053", "10.244.1.5:5353"),
			udp("10.0.0.1:40002", "192.168.0.10:30053", "10.244.2.6:5353"),
			udp("10.0.0.1:40003", "192.168.0.99:30053", "10.244.1.5:5353"), // not a local address
		},
		want: []Flow{
			udp("10.0.0.1:40000", "192.168.0.10:30053", "10.244.1.5:5353"),
			udp("[fd00::1]:40000", "[fd00:1::10]:30053", "[fd00:244::5]:5353"),
			udp("10.0.0.1:40001", "172.17.0.1:30053", "10.244.1.5:5353"),
		},
	}, {
		name: "ExternalIP and LoadBalancer IP",
		prev: snap(withExternal(dns(e1))),
		next: snap(withExternal(dns(e2))),
		flows: []Flow{
			udp("10.0.0.1:40000", "203.0.113.7:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40001", "198.51.100.9:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40002", "198.51.100.9:53", "10.244.2.6:5353"),
		},
		want: []Flow{
			udp("10.0.0.1:40000", "203.0.113.7:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40001", "198.51.100.9:53", "10.244.1.5:5353"),
		},
	}, {
		name: "SCTP",
		prev: snap(sctp(ep("10.244.1.5", 3868))),
		next: snap(sctp(ep("10.244.2.6", 3868))),
		flows: []Flow{
			flow(protoSCTP, "10.0.0.1:40000", "10.96.0.20:3868", "10.244.1.5:3868"),
			flow(protoSCTP, "10.0.0.1:40001", "10.96.0.20:3868", "10.244.2.6:3868"),
		},
		want: []Flow{flow(protoSCTP, "10.0.0.1:40000", "10.96.0.20:3868", "10.244.1.5:3868")},
	}, {
		name: "two service ports on one address: the union serves",
		prev: snap(dns(e1), svc("dup", k8s.UDP, "10.96.0.10", 53, e2)),
		next: snap(dns(e1), svc("dup", k8s.UDP, "10.96.0.10", 53, e3)),
		flows: []Flow{
			udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"),
			udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.2.6:5353"),
			udp("10.0.0.1:40002", "10.96.0.10:53", "10.244.3.7:5353"),
		},
		want: []Flow{udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.2.6:5353")},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Stale(tt.flows, tt.prev, tt.next, tt.localAddrs...)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("Stale() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMayHaveStale(t *testing.T) {
	e1, e2 := ep("10.244.1.5", 5353), ep("10.244.2.6", 5353)
	dns := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("dns", k8s.UDP, "10.96.0.10", 53, eps...) }
	tcp := func(eps ...k8s.Endpoint) k8s.ServicePort { return svc("web", k8s.TCP, "10.96.0.80", 80, eps...) }
	tests := []struct {
		name       string
		prev, next *k8s.Snapshot
		want       bool
	}{
		{"unchanged", snap(dns(e1)), snap(dns(e1)), false},
		{"endpoint added", snap(dns(e1)), snap(dns(e1, e2)), false},
		{"endpoint removed", snap(dns(e1, e2)), snap(dns(e1)), true},
		{"first endpoint", snap(dns()), snap(dns(e1)), true},
		{"service added without endpoints", snap(), snap(dns()), false},
		{"service removed", snap(dns(e1)), snap(), true},
		{"only TCP changed", snap(tcp(e1)), snap(tcp(e2)), false},
		{"unknown prev", nil, snap(dns(e1)), true},
		{"unknown prev, no UDP service", nil, snap(tcp(e1)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newSelector(tt.prev, tt.next, nil).mayHaveStale(); got != tt.want {
				t.Errorf("mayHaveStale() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFlowString(t *testing.T) {
	for _, tt := range []struct {
		f    Flow
		want string
	}{
		{udp("10.0.0.1:40000", "10.96.0.10:53", "10.244.1.5:5353"), "udp 10.0.0.1:40000 -> 10.96.0.10:53 => 10.244.1.5:5353"},
		{flow(protoTCP, "[fd00::1]:1", "[fd00::2]:2", ""), "tcp [fd00::1]:1 -> [fd00::2]:2"},
		{Flow{Proto: 1, Zone: 7}, "proto-1 invalid AddrPort -> invalid AddrPort zone 7"},
	} {
		if got := tt.f.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

// benchFlows returns 10,000 flows of which 100 are stale after prev → next:
// 1,000 UDP services with 3 endpoints each, one endpoint removed from 100 of
// them, and TCP and foreign flows mixed in, as a busy node would have.
func benchFlows() (flows []Flow, prev, next *k8s.Snapshot) {
	prev, next = snap(), snap()
	for i := range 1000 {
		vip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		var eps []k8s.Endpoint
		for j := range 3 {
			eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", j, i%250+1), 5353))
		}
		prev.Services = append(prev.Services, svc(fmt.Sprintf("s%d", i), k8s.UDP, vip, 53, eps...))
		if i%10 == 0 {
			eps = eps[1:]
		}
		next.Services = append(next.Services, svc(fmt.Sprintf("s%d", i), k8s.UDP, vip, 53, eps...))
		for j := range 10 {
			client := fmt.Sprintf("10.0.%d.%d:%d", j, i%250+1, 30000+i)
			switch {
			case j == 0: // DNATed to eps[0] of prev: stale for every tenth service
				flows = append(flows, udp(client, vip+":53", prev.Services[i].Endpoints[0].Addr.String()+":5353"))
			case j < 6:
				flows = append(flows, udp(client, vip+":53", prev.Services[i].Endpoints[1+j%2].Addr.String()+":5353"))
			case j < 8:
				flows = append(flows, flow(protoTCP, client, vip+":80", prev.Services[i].Endpoints[0].Addr.String()+":8080"))
			default:
				flows = append(flows, udp(client, "10.1.0.53:53", ""))
			}
		}
	}
	return flows, prev, next
}

func BenchmarkStale(b *testing.B) {
	flows, prev, next := benchFlows()
	if n := len(Stale(flows, prev, next)); len(flows) != 10000 || n != 100 {
		b.Fatalf("benchmark setup: %d flows, %d stale; want 10000, 100", len(flows), n)
	}
	b.ReportAllocs()
	for b.Loop() {
		Stale(flows, prev, next)
	}
}
