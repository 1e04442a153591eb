package proxier

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/netns"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// TestGoldenRulesetsThroughNetlink applies every golden ruleset over netlink
// in a fresh namespace: `nft list table` must print exactly the golden text,
// and so must the table read back with nftnl.Read (`nftproxy list`).
// (The goldens also load with `nft -f` and list back unchanged; the nftmodel
// differential test proves that side for every expression.)
func TestGoldenRulesetsThroughNetlink(t *testing.T) {
	ns := netns.New(t, "pxk")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	for _, tt := range goldenCases() {
		t.Run(tt.name, func(t *testing.T) {
			rs := tt.compile()
			if _, err := nftnl.Apply(conn, rs); err != nil {
				t.Fatalf("apply: %v", err)
			}
			defer func() { _ = nftnl.Delete(conn, rs.Family, rs.Table) }()
			got, err := ns.Exec("nft", "list", "table", rs.Family.String(), rs.Table)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(m.Render(rs), got); diff != "" {
				t.Errorf("nft list table after a netlink apply (-rendered +listed):\n%s", diff)
			}
			read, err := nftnl.Read(conn, rs.Family, rs.Table)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(m.Render(rs), m.Render(read)); diff != "" {
				t.Errorf("table read back after a netlink apply (-rendered +read):\n%s", diff)
			}
		})
	}
}
