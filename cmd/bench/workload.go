package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
)

// The peers phase serves the same API state to nftproxy and to kube-proxy
// in each of its modes. A workload is that state: TCP ClusterIP services on
// port 80, each with ready endpoints on port 8080 in EndpointSlices of at
// most sliceSize endpoints, as the EndpointSlice controller cuts them.
const sliceSize = 100

// workloadSpec names a workload and says how wide each of its services is.
type workloadSpec struct {
	name     string
	title    string
	services int
	// width returns the endpoints of every service.
	width func(services int) []int
	// full and quick mark the workloads a run without --workloads
	// measures, and one with --quick.
	full, quick bool
	// proxies the workload runs by default; nil is every proxy.
	proxies []string
	// unplaced: its endpoints name no node (nodeOf).
	unplaced bool
}

// peerNodes is how many nodes the peers' endpoints are on: a cluster with
// thousands of endpoints has them on many nodes, and every proxy runs as one
// of them (benchNode), which holds about one in peerNodes.
const peerNodes = 100

// nodeOf is the node an endpoint is on: node-1 to node-<peerNodes>, by its
// address, or none when the workload's endpoints are unplaced. (A step's
// replacement endpoint keeps the node of the one it replaces.)
func (s workloadSpec) nodeOf(a netip.Addr) string {
	if s.unplaced {
		return ""
	}
	return fmt.Sprintf("node-%d", addrValue(a)%peerNodes+1)
}

// Zipf's exponent and seed for the mixed workload: P(k endpoints) ∝ k^-2
// gives about 5.5 endpoints per service on average, a few hundred services
// with more than 20 and a handful near the cap.
const (
	zipfExponent = 2
	zipfSeed     = 1
	zipfMax      = 5000
)

func uniform(k int) func(int) []int {
	return func(n int) []int { return slices.Repeat([]int{k}, n) }
}

// zipf returns n widths in 1..zipfMax drawn from a Zipf distribution with
// a fixed seed, so every run serves the same workload.
func zipf(n int) []int {
	r := rand.New(rand.NewPCG(zipfSeed, zipfSeed))
	z := rand.NewZipf(r, zipfExponent, 1, zipfMax-1)
	w := make([]int, n)
	for i := range w {
		w[i] = int(z.Uint64()) + 1
	}
	return w
}

// workloadSpecs are the peers phase's workloads. The full run's first five
// are issue 11's; 30kx3 and 100kx3 give nftproxy's endpoint change at more
// services (kube-proxy's modes need minutes per sync there). --quick runs
// smaller stand-ins of the big ones beside the two wide workloads.
var workloadSpecs = []workloadSpec{
	{name: "10kx3", title: "10,000 services × 3 endpoints", services: 10000, width: uniform(3), full: true},
	{name: "1x5000", title: "1 service × 5,000 endpoints (50 slices of 100)", services: 1, width: uniform(5000), full: true, quick: true},
	{name: "10x1000", title: "10 services × 1,000 endpoints", services: 10, width: uniform(1000), full: true, quick: true},
	{name: "zipf10k", title: "10,000 services, endpoints Zipf-distributed (s = 2, 1 to 5,000)", services: 10000, width: zipf, full: true},
	{name: "100kx1", title: "100,000 services × 1 endpoint", services: 100000, width: uniform(1), full: true},
	{name: "30kx3", title: "30,000 services × 3 endpoints", services: 30000, width: uniform(3), full: true, proxies: []string{proxyNftproxy}},
	{name: "100kx3", title: "100,000 services × 3 endpoints", services: 100000, width: uniform(3), full: true, proxies: []string{proxyNftproxy}},
	{name: "1kx3", title: "1,000 services × 3 endpoints", services: 1000, width: uniform(3), quick: true},
	{name: "zipf1k", title: "1,000 services, endpoints Zipf-distributed (s = 2, 1 to 5,000)", services: 1000, width: zipf, quick: true},
	{name: "10kx1", title: "10,000 services × 1 endpoint", services: 10000, width: uniform(1), quick: true},
}

// defaultWorkloads are what a run without --workloads measures.
func defaultWorkloads(quick bool) []string {
	return specNames(func(s workloadSpec) bool { return quick && s.quick || !quick && s.full })
}

func workloadNames() string {
	return strings.Join(specNames(func(workloadSpec) bool { return true }), ",")
}

func specNames(keep func(workloadSpec) bool) []string {
	var out []string
	for _, s := range workloadSpecs {
		if keep(s) {
			out = append(out, s.name)
		}
	}
	return out
}

func findWorkload(name string) (workloadSpec, bool) {
	i := slices.IndexFunc(workloadSpecs, func(s workloadSpec) bool { return s.name == name })
	if i < 0 {
		return workloadSpec{}, false
	}
	return workloadSpecs[i], true
}

// workload is the generated API state of a spec.
type workload struct {
	spec     workloadSpec
	services []wlService
}

// wlService is one Service with its endpoints.
type wlService struct {
	name      string
	clusterIP netip.Addr
	endpoints []netip.Addr
}

// slices cuts the endpoints into EndpointSlices of at most sliceSize.
func (s *wlService) slices() [][]netip.Addr {
	var out [][]netip.Addr
	for eps := s.endpoints; len(eps) > 0; {
		k := min(len(eps), sliceSize)
		out = append(out, eps[:k])
		eps = eps[k:]
	}
	return out
}

func sliceName(service string, j int) string { return fmt.Sprintf("%s-%03d", service, j) }

// Addresses: ClusterIPs from 10.96.1.0 up inside the API server's
// 10.96.0.0/12 (a /16 holds too few for 100,000 services), the step's new
// services from the top of it; endpoints from 10.128.0.1 up (10.128.0.0/10
// holds four million), replacement endpoints in 10.192.0.0/16. None of them
// is routed anywhere: the proxies only write rules that name them.
var (
	benchServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
	peersClusterCIDR = netip.MustParsePrefix("10.128.0.0/10")
)

func addrValue(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addrPlus(base netip.Addr, n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, addrValue(base)+n)))
}

func wlClusterIP(i int) netip.Addr { return addrPlus(netip.MustParseAddr("10.96.1.0"), uint32(i)) }

func wlEndpoint(k int) netip.Addr { return addrPlus(netip.MustParseAddr("10.128.0.1"), uint32(k)) }

// addedClusterIP is the ClusterIP of the service the k-th proxy run adds.
func addedClusterIP(k int) netip.Addr {
	return addrPlus(netip.MustParseAddr("10.111.255.1"), uint32(k))
}

// replacementEndpoint is the address the k-th endpoint step puts in.
func replacementEndpoint(k int) netip.Addr {
	return addrPlus(netip.MustParseAddr("10.192.0.1"), uint32(k))
}

// generate builds the workload's services. Pure: the same spec gives the
// same services.
func (s workloadSpec) generate() *workload {
	w := &workload{spec: s, services: make([]wlService, s.services)}
	widths := s.width(s.services)
	next := 0
	for i := range w.services {
		eps := make([]netip.Addr, widths[i])
		for j := range eps {
			eps[j] = wlEndpoint(next)
			next++
		}
		w.services[i] = wlService{name: fmt.Sprintf("svc-%06d", i), clusterIP: wlClusterIP(i), endpoints: eps}
	}
	return w
}

// endpoints returns the number of endpoints of all services.
func (w *workload) endpoints() int {
	n := 0
	for _, s := range w.services {
		n += len(s.endpoints)
	}
	return n
}

// objects returns how many Services and EndpointSlices the workload writes.
func (w *workload) objects() (services, slices int) {
	for _, s := range w.services {
		slices += len(s.slices())
	}
	return len(w.services), slices
}

// stepService picks the service whose endpoint the endpoint step replaces:
// the widest, and the middle one when all are as wide (no end of a sorted
// list is favoured).
func (w *workload) stepService() int {
	widest, at := -1, 0
	for i, s := range w.services {
		if len(s.endpoints) > widest {
			widest, at = len(s.endpoints), i
		}
	}
	if mid := len(w.services) / 2; len(w.services[mid].endpoints) == widest {
		return mid
	}
	return at
}
