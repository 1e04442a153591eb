package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestZipfWidths(t *testing.T) {
	a := zipf(10000)
	b := zipf(10000)
	if !slicesEqual(a, b) {
		t.Fatal("same seed, different widths")
	}
	total, ones, wide, widest := 0, 0, 0, 0
	for _, w := range a {
		if w < 1 || w > zipfMax {
			t.Fatalf("width %d outside 1..%d", w, zipfMax)
		}
		total += w
		widest = max(widest, w)
		if w == 1 {
			ones++
		}
		if w >= 100 {
			wide++
		}
	}
	// P(1) = 1/ζ(2) ≈ 0.61; the mean over 1..5000 is about 5.5.
	if f := float64(ones) / 10000; f < 0.57 || f > 0.65 {
		t.Errorf("%.2f of the services have one endpoint, want about 0.61", f)
	}
	if mean := float64(total) / 10000; mean < 3 || mean > 9 {
		t.Errorf("mean width %.1f, want about 5.5", mean)
	}
	if wide == 0 || widest < 500 {
		t.Errorf("%d services of 100 endpoints or more, the widest %d: the tail is missing", wide, widest)
	}
	t.Logf("zipf10k: %d endpoints, %d services with ≥ 100, widest %d", total, wide, widest)
}

func slicesEqual(a, b []int) bool { return cmp.Equal(a, b) }

func TestWorkloadGenerate(t *testing.T) {
	tests := []struct {
		name                       string
		services, endpoints, slice int
		step                       int
	}{
		{"10kx3", 10000, 30000, 10000, 5000},
		{"1x5000", 1, 5000, 50, 0},
		{"10x1000", 10, 10000, 100, 5},
		{"100kx1", 100000, 100000, 100000, 50000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, ok := findWorkload(tt.name)
			if !ok {
				t.Fatal("no such workload")
			}
			w := spec.generate()
			services, slices := w.objects()
			if services != tt.services || w.endpoints() != tt.endpoints || slices != tt.slice {
				t.Errorf("got %d services, %d endpoints, %d slices; want %d, %d, %d",
					services, w.endpoints(), slices, tt.services, tt.endpoints, tt.slice)
			}
			if got := w.stepService(); got != tt.step {
				t.Errorf("step service %d, want %d", got, tt.step)
			}
			seen := map[netip.Addr]bool{}
			for _, s := range w.services {
				if !benchServiceCIDR.Contains(s.clusterIP) || seen[s.clusterIP] {
					t.Fatalf("%s: ClusterIP %s outside %s or taken twice", s.name, s.clusterIP, benchServiceCIDR)
				}
				seen[s.clusterIP] = true
				for _, e := range s.endpoints {
					if !peersClusterCIDR.Contains(e) || seen[e] {
						t.Fatalf("%s: endpoint %s outside %s or taken twice", s.name, e, peersClusterCIDR)
					}
					seen[e] = true
				}
			}
		})
	}
}

func TestWorkloadStepService(t *testing.T) {
	w := zipfWorkload()
	i := w.stepService()
	for _, s := range w.services {
		if len(s.endpoints) > len(w.services[i].endpoints) {
			t.Fatalf("step service %d has %d endpoints, %s has more", i, len(w.services[i].endpoints), s.name)
		}
	}
}

func zipfWorkload() *workload {
	spec, _ := findWorkload("zipf10k")
	return spec.generate()
}

func TestWorkloadAddressesApart(t *testing.T) {
	// The step's addresses must never be the workload's: a watch looks for them.
	w := zipfWorkload()
	for k := range 20 {
		for _, a := range append([]netip.Addr{addedClusterIP(k), replacementEndpoint(k)}, addedEndpoints(k)...) {
			if peersClusterCIDR.Contains(a) {
				t.Errorf("step address %s inside the workload's endpoints", a)
			}
			if a == w.services[len(w.services)-1].clusterIP {
				t.Errorf("step address %s is a workload ClusterIP", a)
			}
		}
		if !benchServiceCIDR.Contains(addedClusterIP(k)) {
			t.Errorf("added ClusterIP %s outside %s", addedClusterIP(k), benchServiceCIDR)
		}
	}
	if last := wlClusterIP(99999); !last.Less(addedClusterIP(0)) {
		t.Errorf("ClusterIP of service 99,999 (%s) reaches the added services' (%s)", last, addedClusterIP(0))
	}
}

func TestSlices(t *testing.T) {
	s := wlService{}
	for k := range 250 {
		s.endpoints = append(s.endpoints, wlEndpoint(k))
	}
	got := s.slices()
	if len(got) != 3 || len(got[0]) != 100 || len(got[2]) != 50 {
		t.Errorf("250 endpoints cut into %d slices", len(got))
	}
}

// peerFixture is a run with every kind of cell: figures, a step over the
// limit and the steps it left out, and a failure.
func peerFixture() *PeerRun {
	p := &PeerRun{LimitMS: 300000, Workloads: []PeerWorkload{
		{Name: "10kx3", Title: "10,000 services × 3 endpoints", Services: 10000, Endpoints: 30000, Slices: 10000, CreateS: 40},
		{Name: "100kx1", Title: "100,000 services × 1 endpoint", Services: 100000, Endpoints: 100000, Slices: 100000, CreateS: 400},
	}}
	fig := func(w, proxy string, full, ep, epWall, svc, svcWall float64) {
		p.add(w, proxy, peerStart, full+500, 0)
		p.add(w, proxy, peerFullSync, full, 1)
		p.add(w, proxy, peerRSS, 100, 0)
		p.add(w, proxy, peerEndpoint, ep, 1)
		p.add(w, proxy, peerEndpointWal, epWall, 0)
		p.add(w, proxy, peerService, svc, 2)
		p.add(w, proxy, peerServiceWall, svcWall, 0)
		p.add(w, proxy, peerPeak, 120, 0)
	}
	fig("10kx3", proxyKubeNft, 18100, 4187, 4184, 4000, 4137)
	fig("10kx3", proxyKubeIptNft, 101600, 1120, 1115, 1000, 1009)
	fig("10kx3", proxyKubeLegacy, 1520, 766, 766, 700, 740)
	fig("10kx3", proxyNftproxy, 174, 2.78, 11.8, 2.5, 52.4)
	fig("100kx1", proxyNftproxy, 2100, 1.5, 3, 2, 10)
	p.add("10kx3", proxyNftproxy, peerFullWhole, 180, 1)
	for proxy, own := range map[string]float64{proxyKubeNft: 4180, proxyKubeIptNft: 1110, proxyKubeLegacy: 760, proxyNftproxy: 1.2} {
		p.add("10kx3", proxy, peerEndpointOwn, own, 0)
	}
	fig("100kx1", proxyKubeLegacy, 30000, 9000, 9100, 9000, 9500)
	p.Records = append(p.Records, PeerRecord{Workload: "100kx1", Proxy: proxyKubeNft, Metric: peerFullSync, Value: 300000, Skip: overLimit})
	skip(p, "100kx1", proxyKubeNft, peerEndpoint, "not measured: full-sync over the time limit")
	skip(p, "100kx1", proxyKubeIptNft, peerFullSync, "the proxy exited: boom")
	return p
}

func TestPeerRatios(t *testing.T) {
	p := peerFixture()
	tests := []struct {
		workload, metric string
		want             string
		verdict          string
	}{
		{"10kx3", peerFullSync, "0.114 (174 ms / 1.52 s, iptables-legacy)", "**missed**"},
		{"10kx3", peerEndpoint, "0.00363 (2.78 ms / 766 ms, iptables-legacy)", "met"},
		{"10kx3", peerServiceWall, "0.0708 (52.4 ms / 740 ms, iptables-legacy)", "**missed**"},
		{"100kx1", peerFullSync, "0.07 (2.10 s / 30.0 s, iptables-legacy)", "met"},
	}
	for _, tt := range tests {
		got, verdict := p.ratio(tt.workload, tt.metric, 0.1)
		if tt.metric == peerEndpoint {
			got, verdict = p.ratio(tt.workload, tt.metric, 0.01)
		}
		if tt.metric == peerServiceWall {
			got, verdict = p.ratio(tt.workload, tt.metric, 0.02)
		}
		if got != tt.want || verdict != tt.verdict {
			t.Errorf("%s %s: got %q %q, want %q %q", tt.workload, tt.metric, got, verdict, tt.want, tt.verdict)
		}
	}
	// Only a mode over the limit: the ratio is an upper bound.
	q := &PeerRun{LimitMS: 300000}
	q.add("w", proxyNftproxy, peerFullSync, 3000, 1)
	q.Records = append(q.Records, PeerRecord{Workload: "w", Proxy: proxyKubeNft, Metric: peerFullSync, Value: 300000, Skip: overLimit})
	if got, _ := q.ratio("w", peerFullSync, 0.1); got != "< 0.01 (3.00 s / > 300.0 s, nftables)" {
		t.Errorf("over the limit: got %q", got)
	}
}

func TestPeersMarkdown(t *testing.T) {
	r := &Results{Peers: peerFixture()}
	md := r.markdown()
	for _, want := range []string{
		"## Against kube-proxy",
		"| 10kx3 | 0.114 (174 ms / 1.52 s, iptables-legacy) **missed** |",
		"| kube-proxy nftables | – | > 5 min | not run | – | – | – | – | – |",
		"| nftproxy | 2.60 s | 2.10 s | 1.50 ms | 3.00 ms | 2.00 ms (2 syncs) | 10.0 ms | 100 MiB | 120 MiB |",
		"- 100kx1, kube-proxy iptables (nft backend), full sync: the proxy exited: boom",
		"![10,000 services × 3 endpoints](bench-peers-10kx3.svg)",
		"| 10000 | 2.78 ms | 11.8 ms | 1.00 |",
		"| endpoint change: workload | nftproxy | kube-proxy nftables | kube-proxy iptables (nft backend) | kube-proxy iptables-legacy | nftproxy / fastest kube-proxy | nftproxy's share: its sync + the rest |",
		"| 10kx3 | 1.20 ms | 4.18 s | 1.11 s | 760 ms | 0.00158 (1.20 ms / 760 ms, iptables-legacy) | 2.78 ms + 0.000 ms |",
		"the whole first sync, with the empty IPv6 table that kube-proxy's second proxier syncs apart (`nftproxy_sync_duration_seconds`): 180 ms.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
}

func TestPeerPlots(t *testing.T) {
	dir := t.TempDir()
	r := &Results{Peers: peerFixture()}
	if err := r.writePeerPlots(dir); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"10kx3", "100kx1"} {
		st, err := os.Stat(filepath.Join(dir, peerPlotFile(w)))
		if err != nil || st.Size() < 1000 {
			t.Errorf("plot of %s: %v", w, err)
		}
	}
}

func TestMergeResults(t *testing.T) {
	old := &Results{Runs: 3, Records: []Record{{N: 1000, Metric: metricFullSync, Method: methodNftproxy, Values: []float64{1}}},
		Peers: peerFixture()}
	cur := &Results{Peers: &PeerRun{LimitMS: 300000, Workloads: []PeerWorkload{{Name: "10kx3", Services: 10000, CreateS: 41}}}}
	cur.Peers.add("10kx3", proxyNftproxy, peerFullSync, 150, 1)
	got := mergeResults(old, cur)
	if got.Runs != 3 || len(got.Records) != 1 {
		t.Errorf("the other phases' results were dropped: %+v", got)
	}
	p := got.Peers
	if v, _ := p.value("10kx3", proxyNftproxy, peerFullSync); v != 150 {
		t.Errorf("nftproxy's full sync %v, want the new 150", v)
	}
	if p.find("10kx3", proxyNftproxy, peerEndpoint) != nil {
		t.Error("an old figure of a re-measured pair stayed")
	}
	if v, _ := p.value("10kx3", proxyKubeNft, peerFullSync); v != 18100 {
		t.Errorf("kube-proxy's old full sync %v, want 18100 kept", v)
	}
	if len(p.Workloads) != 2 || p.Workloads[0].CreateS != 41 || p.Workloads[1].Name != "100kx1" {
		t.Errorf("workloads %+v", p.Workloads)
	}
	// A run of the other phases keeps the saved peers figures.
	again := mergeResults(got, &Results{Runs: 1, Records: old.Records})
	if again.Runs != 1 || again.Peers == nil || len(again.Peers.Records) != len(p.Records) {
		t.Error("peers figures lost by a run without the peers phase")
	}
	// A run of one phase replaces its own records and keeps the others'.
	daemon := Record{N: 1000, Metric: "daemon_rss", Method: methodNftproxy, Values: []float64{40}}
	resync := Record{N: 1000, Metric: metricFullSync, Method: methodNftproxy, Values: []float64{2}}
	third := mergeResults(again, &Results{Runs: 1, Records: []Record{daemon, resync}})
	if want := []Record{resync, daemon}; !cmp.Equal(third.Records, want) {
		t.Errorf("records after a partial run: %+v, want %+v", third.Records, want)
	}
}

func TestProxiesFor(t *testing.T) {
	spec, _ := findWorkload("30kx3")
	if got := proxiesFor(spec, allProxies, false); !cmp.Equal(got, []string{proxyNftproxy}) {
		t.Errorf("30kx3 by default: %v", got)
	}
	if got := proxiesFor(spec, allProxies, true); len(got) != 4 {
		t.Errorf("30kx3 with --proxies: %v", got)
	}
	if _, _, err := parsePeers("nope", "", false); err == nil {
		t.Error("unknown workload accepted")
	}
	if _, _, err := parsePeers("", "kube-proxy-ipvs", false); err == nil {
		t.Error("unknown proxy accepted")
	}
}

// TestPeerRunFold: several runs of a proxy become one record a metric, the
// median of those that measured it with every run's figure; a metric no run
// measured keeps the first reason; other proxies are left alone.
func TestPeerRunFold(t *testing.T) {
	p := &PeerRun{}
	p.add("1x5000", proxyNftproxy, peerFullSync, 9, 1)
	p.add("1x5000", proxyKubeNft, peerFullSync, 94, 1)
	p.add("1x5000", proxyNftproxy, peerEndpoint, 1.1, 2)
	skip(p, "1x5000", proxyNftproxy, peerService, "boom")
	p.add("1x5000", proxyNftproxy, peerFullSync, 7, 1)
	p.add("1x5000", proxyNftproxy, peerEndpoint, 4.0, 1)
	skip(p, "1x5000", proxyNftproxy, peerService, "boom again")
	p.add("1x5000", proxyNftproxy, peerFullSync, 12, 1)
	p.fold("1x5000", proxyNftproxy)
	if len(p.Records) != 4 {
		t.Fatalf("%d records after folding, want 4: %+v", len(p.Records), p.Records)
	}
	full := p.find("1x5000", proxyNftproxy, peerFullSync)
	if full.Value != 9 || !slices.Equal(full.Samples, []float64{9, 7, 12}) {
		t.Errorf("full sync %+v, want the median 9 of 9, 7, 12", full)
	}
	if ep := p.find("1x5000", proxyNftproxy, peerEndpoint); ep.Value != 1.1 || ep.Syncs != 2 || len(ep.Samples) != 2 {
		t.Errorf("endpoint %+v, want the lower middle 1.1 with its 2 syncs and both samples", ep)
	}
	if svc := p.find("1x5000", proxyNftproxy, peerService); svc.Skip != "boom" {
		t.Errorf("service %+v, want the first reason", svc)
	}
	if kube := p.find("1x5000", proxyKubeNft, peerFullSync); kube.Value != 94 || kube.Samples != nil {
		t.Errorf("kube-proxy's record changed: %+v", kube)
	}
	if got := p.cell("1x5000", proxyNftproxy, peerFullSync, fmtMS); got != "9.00 ms (median of 3, 7.00 ms–12.0 ms)" {
		t.Errorf("cell %q", got)
	}
}

// TestWorkloadEndpointsOnNodes: a peers workload's endpoints are spread over
// peerNodes nodes, the proxies' own among them; the soak names none.
func TestWorkloadEndpointsOnNodes(t *testing.T) {
	spec, _ := findWorkload("10x1000")
	w := spec.generate()
	nodes := map[string]int{}
	for _, s := range w.services {
		for j, addrs := range s.slices() {
			for _, e := range sliceObject(s.name, j, addrs, spec.nodeOf).Endpoints {
				if e.NodeName == nil {
					t.Fatalf("endpoint %v names no node", e.Addresses)
				}
				nodes[*e.NodeName]++
			}
		}
	}
	if len(nodes) != peerNodes || nodes[benchNode] != w.endpoints()/peerNodes {
		t.Errorf("%d nodes, %d endpoints on %s; want %d nodes, %d there", len(nodes), nodes[benchNode], benchNode, peerNodes, w.endpoints()/peerNodes)
	}
	soak := workloadSpec{unplaced: true}
	for _, nodeOf := range []func(netip.Addr) string{nil, soak.nodeOf} {
		if e := sliceObject("soak", 0, w.services[0].endpoints[:1], nodeOf).Endpoints[0]; e.NodeName != nil {
			t.Errorf("an unplaced endpoint names node %s", *e.NodeName)
		}
	}
}

// skip records why a figure is missing.
func skip(p *PeerRun, workload, proxy, metric, why string) {
	p.Records = append(p.Records, PeerRecord{Workload: workload, Proxy: proxy, Metric: metric, Skip: why})
}
