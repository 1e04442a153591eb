package main

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// The benchmark's services: N TCP services, each with three ready endpoints
// on port 8080 and a ClusterIP in 10.96.0.0/16; one in twenty has a NodePort
// (the NodePort range holds only 2,768 ports). Endpoints have addresses of
// their own in 10.128.0.0/10, except in the dataplane run, where the first
// and the last service point at the topology's real pods.
const (
	endpointsPerService = 3
	nodePortEvery       = 20
	servicePort         = 80
	endpointPort        = 8080
)

// clusterCIDR is where pods live: ClusterIP traffic from elsewhere is
// masqueraded, in both proxies.
var clusterCIDR = netns.ClusterCIDR

var compileConfig = proxier.Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{clusterCIDR}}

// clusterIP returns the i-th ClusterIP: 64,000 in each /16 from 10.96.0.0.
func clusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96 + byte(i/64000), byte(i % 64000 / 250), byte(i%250 + 1)})
}

// nodePort returns the service's NodePort, 0 for none: one service in
// nodePortEvery has one, while the default range (to 32767) lasts.
func nodePort(i int) uint16 {
	if i%nodePortEvery != 0 || 30000+i/nodePortEvery > 32767 {
		return 0
	}
	return uint16(30000 + i/nodePortEvery)
}

// endpointAddr returns the n-th address of 10.128.0.0/10.
func endpointAddr(n uint32) netip.Addr { return addrPlus(netip.AddrFrom4([4]byte{10, 128, 0, 0}), n) }

func endpoint(a netip.Addr) k8s.Endpoint {
	return k8s.Endpoint{Addr: a, Port: endpointPort, Ready: true, Serving: true}
}

// service returns the i-th service port with its own three endpoints.
func service(i int) k8s.ServicePort {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: fmt.Sprintf("svc-%05d", i), Port: "http", Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{clusterIP(i)},
		Port:       servicePort,
		NodePort:   nodePort(i),
	}
	for j := range endpointsPerService {
		sp.Endpoints = append(sp.Endpoints, endpoint(endpointAddr(uint32(endpointsPerService*i+j+1))))
	}
	return sp
}

// snapshot returns n services, sorted by name as the tracker sorts them.
// Services listed in real point at the given pod addresses instead.
func snapshot(n int, real map[int][]netip.Addr) *k8s.Snapshot {
	snap := &k8s.Snapshot{Services: make([]k8s.ServicePort, n), Node: k8s.Node{Name: "node-1"}}
	for i := range n {
		snap.Services[i] = service(i)
		if pods, ok := real[i]; ok {
			snap.Services[i].Endpoints = nil
			for _, a := range pods {
				snap.Services[i].Endpoints = append(snap.Services[i].Endpoints, endpoint(a))
			}
		}
	}
	return snap
}

// withEndpointChanged returns snap where the last endpoint of service i has
// the address to (the endpoint count stays the same). Only the changed
// service's endpoint list is copied, as the tracker does.
func withEndpointChanged(snap *k8s.Snapshot, i int, to netip.Addr) *k8s.Snapshot {
	next := &k8s.Snapshot{Services: slices.Clone(snap.Services), Node: snap.Node}
	eps := slices.Clone(next.Services[i].Endpoints)
	eps[len(eps)-1] = endpoint(to)
	next.Services[i].Endpoints = eps
	return next
}

// withServiceAdded returns snap with service i added. Its name sorts last
// when i is beyond the services snap holds.
func withServiceAdded(snap *k8s.Snapshot, i int) *k8s.Snapshot {
	return &k8s.Snapshot{Services: append(slices.Clip(snap.Services), service(i)), Node: snap.Node}
}

// change is one update: the snapshot after it, the service it touched and
// the endpoints it took from that service.
type change struct {
	snap    *k8s.Snapshot
	service int
	gone    []k8s.Endpoint
}

// changer makes the update phase's changes of snap, which whoever applies
// one moves on to its snapshot: nftproxy's paths and kube-proxy's restores
// make the same ones.
type changer struct {
	snap *k8s.Snapshot
	next int // the next fresh endpoint address
}

// kind is one kind of update: its metric and the change of each run.
type kind struct {
	metric string
	next   func(run int) change
}

// kinds are an endpoint change, the last endpoint of a different service
// each run (spread over the table) replaced, and a service added.
func (c *changer) kinds(runs int) []kind {
	endpointChange := func(run int) change {
		i := (run + 1) * len(c.snap.Services) / (runs + 2)
		c.next++
		eps := c.snap.Services[i].Endpoints
		return change{withEndpointChanged(c.snap, i, endpointAddr(uint32(1<<21+c.next))), i, eps[len(eps)-1:]}
	}
	serviceAdded := func(int) change {
		i := len(c.snap.Services)
		return change{withServiceAdded(c.snap, i), i, nil}
	}
	return []kind{{metricEndpointChange, endpointChange}, {metricServiceAdded, serviceAdded}}
}

// chainHash names per-service chains the way kube-proxy does: a prefix and
// 16 characters of base32(sha256(what)).
func chainHash(prefix, what string) string {
	sum := sha256.Sum256([]byte(what))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func svcChain(sp *k8s.ServicePort) string { return chainHash("KUBE-SVC-", sp.Name.String()+"tcp") }
func extChain(sp *k8s.ServicePort) string { return chainHash("KUBE-EXT-", sp.Name.String()+"tcp") }
func sepChain(sp *k8s.ServicePort, e k8s.Endpoint) string {
	return chainHash("KUBE-SEP-", sp.Name.String()+"tcp"+addrPort(e).String())
}

func addrPort(e k8s.Endpoint) netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// iptablesRestore is the input kube-proxy's iptables mode gives
// iptables-restore for these services, in its large-cluster form (more than
// 1,000 endpoints: no comments on per-endpoint rules).
type iptablesRestore struct {
	// jumps adds the rules that hook kube-proxy's chains into the built-in
	// ones; kube-proxy adds those once with `iptables -I`, outside the
	// restore, so only the first load of a fresh namespace carries them.
	jumps bool
	// only lists the services whose chains are written; nil writes every
	// service's chains (a full sync). kube-proxy's partial sync rewrites
	// the top-level chains in full but only the chains of changed services.
	only map[int]bool
	// stale names chains to delete (a removed endpoint's KUBE-SEP).
	stale []string
}

// text renders the restore input for services.
func (r iptablesRestore) text(services []k8s.ServicePort) string {
	var b strings.Builder
	b.Grow(len(services) * 1200)
	r.filter(&b)
	r.natChains(&b, services)
	// The top-level chains, always written in full.
	for i := range services {
		s := &services[i]
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport %d -j %s\n",
			s.ClusterIPs[0], s.Name, s.Port, svcChain(s))
	}
	for i := range services {
		s := &services[i]
		if s.NodePort != 0 {
			fmt.Fprintf(&b, "-A KUBE-NODEPORTS -p tcp -m comment --comment \"%s\" -m tcp --dport %d -j %s\n",
				s.Name, s.NodePort, extChain(s))
		}
	}
	b.WriteString("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n")
	for i := range services {
		if r.writes(i) {
			serviceRules(&b, &services[i])
		}
	}
	for _, c := range r.stale {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// writes reports whether service i's chains are written.
func (r iptablesRestore) writes(i int) bool { return r.only == nil || r.only[i] }

// filter writes the filter table, whole.
func (r iptablesRestore) filter(b *strings.Builder) {
	b.WriteString("*filter\n")
	for _, c := range []string{"KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-SERVICES"} {
		fmt.Fprintf(b, ":%s - [0:0]\n", c)
	}
	if r.jumps {
		b.WriteString(`-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
`)
	}
	b.WriteString(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
`)
}

// natChains starts the nat table: its chains declared (and so flushed),
// the jumps into them on a first load, and the fixed chains' rules.
func (r iptablesRestore) natChains(b *strings.Builder, services []k8s.ServicePort) {
	b.WriteString("*nat\n")
	for _, c := range []string{"KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-SERVICES"} {
		fmt.Fprintf(b, ":%s - [0:0]\n", c)
	}
	for i := range services {
		if !r.writes(i) {
			continue
		}
		s := &services[i]
		fmt.Fprintf(b, ":%s - [0:0]\n", svcChain(s))
		if s.NodePort != 0 {
			fmt.Fprintf(b, ":%s - [0:0]\n", extChain(s))
		}
		for _, ep := range s.Endpoints {
			fmt.Fprintf(b, ":%s - [0:0]\n", sepChain(s, ep))
		}
	}
	for _, c := range r.stale {
		fmt.Fprintf(b, ":%s - [0:0]\n", c)
	}
	if r.jumps {
		b.WriteString(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
`)
	}
	b.WriteString(`-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
`)
}

// serviceRules writes one service's own chains: KUBE-EXT, KUBE-SVC with
// its statistic probabilities, and a KUBE-SEP with DNAT per endpoint.
func serviceRules(b *strings.Builder, s *k8s.ServicePort) {
	svc := svcChain(s)
	if s.NodePort != 0 {
		ext := extChain(s)
		fmt.Fprintf(b, "-A %s -m comment --comment \"masquerade traffic for %s external destinations\" -j KUBE-MARK-MASQ\n", ext, s.Name)
		fmt.Fprintf(b, "-A %s -j %s\n", ext, svc)
	}
	fmt.Fprintf(b, "-A %s ! -s %s -d %s/32 -p tcp -m comment --comment \"%s cluster IP\" -m tcp --dport %d -j KUBE-MARK-MASQ\n",
		svc, clusterCIDR, s.ClusterIPs[0], s.Name, s.Port)
	for j, ep := range s.Endpoints {
		left := len(s.Endpoints) - j
		if left > 1 {
			fmt.Fprintf(b, "-A %s -m statistic --mode random --probability %0.11f -j %s\n", svc, 1/float64(left), sepChain(s, ep))
		} else {
			fmt.Fprintf(b, "-A %s -j %s\n", svc, sepChain(s, ep))
		}
	}
	for _, ep := range s.Endpoints {
		sep := sepChain(s, ep)
		fmt.Fprintf(b, "-A %s -s %s/32 -j KUBE-MARK-MASQ\n", sep, ep.Addr)
		fmt.Fprintf(b, "-A %s -p tcp -m tcp -j DNAT --to-destination %s\n", sep, addrPort(ep))
	}
}
