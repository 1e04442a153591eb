package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/prom"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// kernelTable reads the node's ip nftproxy table back over netlink, as
// `nftproxy list` prints it.
func (s *scenario) kernelTable() string {
	s.t.Helper()
	conn, err := nftnl.Dial(s.topo.Node.Fd())
	if err != nil {
		s.t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rs, err := nftnl.Read(conn, nftmodel.IPv4, "nftproxy")
	if err != nil {
		s.t.Fatal(err)
	}
	return nftmodel.Render(rs)
}

// waitKernel polls the kernel's table until ok accepts it and returns how
// long that took; it fails the test after limit.
func (s *scenario) waitKernel(what string, limit time.Duration, ok func(table string) bool) time.Duration {
	s.t.Helper()
	start := time.Now()
	for {
		table := s.kernelTable()
		if ok(table) {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			s.t.Fatalf("%s: not in the kernel after %v; table:\n%s", what, limit, table)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// syncs is the daemon's count of syncs, from its metrics.
func (s *scenario) syncs() uint64 {
	s.t.Helper()
	families, err := prom.Scrape(s.ctx, s.topo.Node, "127.0.0.1:10249")
	if err != nil {
		s.t.Fatal(err)
	}
	// By ip_family, as kube-proxy; each family counts every sync.
	series := prom.Series(families["kubeproxy_sync_proxy_rules_duration_seconds"], "ip_family", "IPv4")
	if series == nil {
		s.t.Fatal("no IPv4 kubeproxy_sync_proxy_rules_duration_seconds in the metrics")
	}
	return series.GetHistogram().GetSampleCount()
}

// aliasBomb is YAML whose aliases would expand to 9^9 strings; the decoder
// refuses it with "excessive aliasing".
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		fmt.Fprintf(&b, "%s: &%s [%s]\n", n, n, strings.TrimSuffix(strings.Repeat("*"+prev+",", 9), ","))
		prev = n
	}
	return b.String()
}

// TestBrokenManifestFileIsIsolated: beside a file that can't be decoded, a
// valid service's changes reach the kernel within a second, and packets
// follow them.
func TestBrokenManifestFileIsIsolated(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10", "10.244.1.11"))
	s.write("broken.yaml", aliasBomb())
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.d.Log(), "excessive aliasing") {
		if time.Now().After(deadline) {
			t.Fatal("the log never named the broken file's reason")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, eps := range [][]string{{"10.244.1.11"}, {"10.244.1.10"}} {
		s.write("web.yaml", webManifests(eps...)["web.yaml"])
		took := s.waitKernel("web with endpoint "+eps[0], time.Second, func(table string) bool {
			return strings.Count(table, "10.244.1.1") == strings.Count(table, eps[0]) && strings.Contains(table, eps[0])
		})
		t.Logf("endpoint %s in the kernel %v after the write", eps[0], took.Round(time.Millisecond))
	}
	if counts := s.askMany(s.topo.Client, webVIP, 20); len(counts) != 1 || counts[s.topo.Pods[0].Name] != 20 {
		t.Errorf("answers %v, want only %s", counts, s.topo.Pods[0].Name)
	}
	if n := strings.Count(s.d.Log(), "excessive aliasing"); n != 1 {
		t.Errorf("the broken file was logged %d times, want once", n)
	}
}

// TestManifestChurnDoesNotStarve rewrites a file every 10 ms for 20 s at
// --min-sync-period 100ms: the daemon keeps syncing throughout (at least
// 50 syncs by its metrics), and the last state is in the kernel within a
// second of the last write.
func TestManifestChurnDoesNotStarve(t *testing.T) {
	s := newScenario(t, 2, webManifests("10.244.1.10"))
	before := s.syncs()
	states := []map[string]string{webManifests("10.244.1.10"), webManifests("10.244.1.10", "10.244.1.11")}
	writes := 0
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); writes++ {
		s.write("web.yaml", states[writes%2]["web.yaml"])
		time.Sleep(10 * time.Millisecond)
	}
	s.write("web.yaml", webManifests("10.244.1.11")["web.yaml"])
	took := s.waitKernel("the last state", time.Second, func(table string) bool {
		return strings.Contains(table, "10.244.1.11") && !strings.Contains(table, "10.244.1.10")
	})
	syncs := s.syncs() - before
	t.Logf("%d writes in 20s: %d syncs; the last state in the kernel %v after the last write", writes+1, syncs, took.Round(time.Millisecond))
	if syncs < 50 {
		t.Errorf("%d syncs during 20 s of rewrites, want at least 50", syncs)
	}
}

// BenchmarkManifestRenameToKernel prints how long a change takes from the
// rename of its file into the manifest directory to the kernel's table
// (read back over netlink every millisecond), p50 and p99, at the default
// --min-sync-period (1s) and at 100ms. Changes are spaced by more than the
// period, as single edits are; a burst is coalesced by it instead. Figures,
// not a pass/fail test:
//
//	go test -run - -bench ManifestRenameToKernel -benchtime 60x ./e2e/
func BenchmarkManifestRenameToKernel(b *testing.B) {
	for _, period := range []time.Duration{time.Second, 100 * time.Millisecond} {
		b.Run("min-sync-period="+period.String(), func(b *testing.B) {
			s := newScenario(b, 2, webManifests("10.244.1.10"), "--min-sync-period", period.String())
			eps := []string{"10.244.1.11", "10.244.1.10"}
			var lat []time.Duration
			b.ResetTimer()
			for i := range b.N {
				ep, old := eps[i%2], eps[(i+1)%2]
				time.Sleep(period + 10*time.Millisecond) // the last sync is more than a period ago
				start := time.Now()
				s.write("web.yaml", webManifests(ep)["web.yaml"])
				for table := ""; !strings.Contains(table, ep) || strings.Contains(table, old); table = s.kernelTable() {
					if time.Since(start) > 10*time.Second {
						b.Fatalf("endpoint %s not in the kernel after 10s", ep)
					}
					time.Sleep(time.Millisecond)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
			b.ReportMetric(float64(q(0.5).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(q(0.99).Microseconds())/1000, "p99-ms")
			b.ReportMetric(0, "ns/op")
			b.Logf("rename → kernel over %d changes: p50 %v, p99 %v, max %v", len(lat),
				q(0.5).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
		})
	}
}
