package nftnl

import (
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// TestPruneElements fills a dynamic map as the packet path would and
// prunes what keep refuses.
func TestPruneElements(t *testing.T) {
	_, conn := nftNS(t)
	set := clientAffinity(nftmodel.TypeIPv4Addr)
	rs := &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "nftproxy-prune", Sets: []*nftmodel.Set{set}}
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	el := func(client, target string) nftmodel.Element {
		return nftmodel.Element{Key: []nftmodel.Value{nftmodel.A(ip(client)), nftmodel.A(ip("10.96.0.10")), nftmodel.N(6), nftmodel.N(80)},
			Data: []nftmodel.Value{nftmodel.A(ip(target)), nftmodel.N(8080)}}
	}
	els := []nftmodel.Element{el("192.168.77.2", "10.244.1.10"), el("192.168.77.3", "10.244.1.11"), el("192.168.77.4", "10.244.1.10")}
	if _, err := ApplyChanges(conn, nftmodel.IPv4, rs.Table, &nftmodel.Changes{AddElements: []nftmodel.SetElements{
		{Set: set.Name, Key: set.Key, Data: set.Data, Timeout: time.Hour, Elements: els}}}); err != nil {
		t.Fatal(err)
	}
	removed := func(e nftmodel.Element) bool { return e.Data[0].Addr != ip("10.244.1.10") }
	n, err := PruneElements(conn, nftmodel.IPv4, rs.Table, set, removed)
	if err != nil || n != 2 {
		t.Fatalf("PruneElements = %d, %v; want 2 deleted", n, err)
	}
	left, err := staleElements(conn, nftmodel.IPv4, rs.Table, set, func(nftmodel.Element) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Data[0].Addr != ip("10.244.1.11") {
		t.Errorf("left after the prune: %v, want the element naming 10.244.1.11", left)
	}
	if n, err := PruneElements(conn, nftmodel.IPv4, rs.Table, set, removed); err != nil || n != 0 {
		t.Errorf("second PruneElements = %d, %v; want nothing to do", n, err)
	}
}
