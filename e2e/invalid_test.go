package e2e

import (
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// TestInvalidDropsCounted: forwarded packets conntrack calls invalid (here
// TCP segments with SYN and FIN set, which no connection sends) are
// dropped, each counted in nftproxy_ct_state_invalid_dropped_packets_total,
// read from the forward rule's counter.
func TestInvalidDropsCounted(t *testing.T) {
	s := newScenario(t, 1, nil)
	invalid := func() float64 {
		t.Helper()
		series := prom.Series(s.ctMetrics()["nftproxy_ct_state_invalid_dropped_packets_total"], "ip_family", "IPv4")
		if series == nil {
			t.Fatal("nftproxy_ct_state_invalid_dropped_packets_total{ip_family=\"IPv4\"} not served")
		}
		return series.GetCounter().GetValue()
	}
	before := invalid()
	mac, err := s.topo.Node.MAC(netns.NodeUplink)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		if err := s.topo.Client.SendRaw(netns.RawFrame{Dev: netns.PodIface, DstMAC: mac, Src: s.topo.ClientAddr,
			Dst: s.topo.Pods[0].Addr, Proto: 6, SrcPort: uint16(41000 + i), DstPort: 8080, TCPFlags: netns.TCPSyn | netns.TCPFin}); err != nil {
			t.Fatal(err)
		}
	}
	var got float64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = invalid() - before; got >= n {
			break
		}
	}
	if got != n {
		t.Errorf("%v invalid packets counted, want the %d sent", got, n)
	}
}
