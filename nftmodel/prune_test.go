package nftmodel

import (
	"testing"
	"time"
)

// TestPruneElements fills a dynamic map as the packet path would and
// prunes what keep refuses.
func TestPruneElements(t *testing.T) {
	_, conn := nftNS(t)
	set := clientAffinity(TypeIPv4Addr)
	rs := &Ruleset{Family: IPv4, Table: "nftproxy-prune", Sets: []*Set{set}}
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	el := func(client, target string) Element {
		return Element{Key: []Value{A(ip(client)), A(ip("10.96.0.10")), N(6), N(80)},
			Data: []Value{A(ip(target)), N(8080)}}
	}
	els := []Element{el("192.168.77.2", "10.244.1.10"), el("192.168.77.3", "10.244.1.11"), el("192.168.77.4", "10.244.1.10")}
	if _, err := ApplyChanges(conn, IPv4, rs.Table, &Changes{AddElements: []SetElements{
		{Set: set.Name, Key: set.Key, Data: set.Data, Timeout: time.Hour, Elements: els}}}); err != nil {
		t.Fatal(err)
	}
	removed := func(e Element) bool { return e.Data[0].Addr != ip("10.244.1.10") }
	n, err := PruneElements(conn, IPv4, rs.Table, set, removed)
	if err != nil || n != 2 {
		t.Fatalf("PruneElements = %d, %v; want 2 deleted", n, err)
	}
	left, err := staleElements(conn, IPv4, rs.Table, set, func(Element) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Data[0].Addr != ip("10.244.1.11") {
		t.Errorf("left after the prune: %v, want the element naming 10.244.1.11", left)
	}
	if n, err := PruneElements(conn, IPv4, rs.Table, set, removed); err != nil || n != 0 {
		t.Errorf("second PruneElements = %d, %v; want nothing to do", n, err)
	}
}
