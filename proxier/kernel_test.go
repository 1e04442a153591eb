package proxier

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
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

// TestSetOutgrowsItsSizeInTheKernel: with sized sets (the service and
// cluster IPs, the endpoints, the hairpin pairs), delta syncs fill a set up
// to its size, and the one that would overflow it becomes a full sync that
// declares the set again, larger, in the same batch as its elements. At
// every step the kernel holds what Compile builds, with the sizes the last
// full sync declared.
func TestSetOutgrowsItsSizeInTheKernel(t *testing.T) {
	defer func(v int) { sizedFrom = v }(sizedFrom)
	sizedFrom = 4
	ns := netns.New(t, "pxs")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	p := New(Options{Configs: []Config{testConfig}, Kernel: nftnl.Kernel{Conn: conn}})
	var sizes []uint32 // of the endpoints map, step by step
	for i, n := range []int{5, 8, 16, 17, 9} {
		snap := &k8s.Snapshot{}
		for j, name := range []string{"a", "b", "c", "d"} {
			snap.Services = append(snap.Services, svc(name, "http", fmt.Sprintf("10.96.0.%d", 20+j), 1))
		}
		snap.Services = append(snap.Services, svc("web", "http", "10.96.0.10", n))
		if err := p.Sync(context.Background(), snap, i == 0); err != nil {
			t.Fatalf("%d endpoints: %v", n, err)
		}
		read, err := nftnl.Read(conn, m.IPv4, TableName)
		if err != nil {
			t.Fatal(err)
		}
		st := p.applied[testConfig.Family]
		declared := map[string]uint32{}
		for decl, size := range st.sizes {
			declared[decl.Name] = size
		}
		for _, name := range []string{mapServiceIPs, setClusterIPs, mapEndpoints, setHairpin} {
			if declared[name] == 0 {
				t.Errorf("%d endpoints: set %s has no size", n, name)
			}
		}
		want := compileWithSlots(snap, testConfig, st.slots)
		for _, s := range want.Sets {
			if s.Timeout == 0 {
				s.Size = declared[s.Name]
			}
		}
		if diff := cmp.Diff(normalRender(want), normalRender(read)); diff != "" {
			t.Errorf("%d endpoints (-compiled +kernel):\n%s", n, diff)
		}
		sizes = append(sizes, declared[mapEndpoints])
	}
	// 4+5 endpoint elements make 32; 4+17 would overflow it: 64.
	if want := []uint32{32, 32, 32, 64, 64}; !slices.Equal(sizes, want) {
		t.Errorf("sizes of the endpoints map %v, want %v", sizes, want)
	}
}
