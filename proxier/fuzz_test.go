package proxier

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s/k8sfuzz"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// fuzzConfigs are the compile configurations of both families, varied by
// the bits of flags.
func fuzzConfigs(flags uint8) []Config {
	v4 := Config{Family: m.IPv4, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	v6 := Config{Family: m.IPv6, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244::/48")}}
	if flags&1 != 0 {
		v4.MasqueradeAll, v6.MasqueradeAll = true, true
	}
	if flags&2 != 0 {
		v4.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.77.0/24")}
		v6.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("fd00:77::/64")}
	}
	if flags&4 != 0 {
		v4.LocalhostNodePorts = true
	}
	if flags&8 != 0 {
		v4.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
		v6.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}
	}
	if flags&16 != 0 {
		v4.ClusterCIDRs, v6.ClusterCIDRs = nil, nil
	}
	return []Config{v4, v6}
}

// FuzzCompileKernel: every ruleset Compile makes of any objects loads with
// `nft -f`, and `nft list table` prints it exactly as Render does. Needs
// root and network namespaces (one per fuzz worker).
func FuzzCompileKernel(f *testing.F) {
	// The seeds are in testdata/fuzz/FuzzCompileKernel.
	ns := netns.New(f, "pfz")
	// The fuzzing engine kills its workers when -fuzztime ends, before their
	// clean-ups run: remove what killed workers left.
	_, _ = netns.CleanupStale("pfz-")
	script := filepath.Join(f.TempDir(), "ruleset.nft")
	f.Fuzz(func(t *testing.T, data []byte, flags uint8) {
		snap, ok := k8sfuzz.Snapshot(data)
		if !ok {
			return
		}
		for _, cfg := range fuzzConfigs(flags) {
			rs := Compile(snap, cfg)
			text := m.Render(rs)
			if rs.Family == m.IPv6 && fillsAffinity(rs) {
				// nft 1.0.6 can't load an IPv6 affinity update from text
				// (TestUpdateMapIPv6ListsAsRendered); netlink only.
				applyAndList(t, ns, rs, text)
				continue
			}
			// Create-then-delete makes the load replace the table atomically.
			load := "table " + rs.Family.String() + " " + rs.Table + "\ndelete table " + rs.Family.String() + " " + rs.Table + "\n" + text
			if err := os.WriteFile(script, []byte(load), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := ns.Exec("nft", "-f", script); err != nil {
				t.Fatalf("nft -f refused the %s ruleset: %v\n%s\n%s", rs.Family, err, out, text)
			}
			got, err := ns.Exec("nft", "list", "table", rs.Family.String(), rs.Table)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(text, got); diff != "" {
				t.Errorf("nft list table differs from the render (-render +listed):\n%s", diff)
			}
		}
	})
}

// fillsAffinity tells whether a ruleset has a rule filling the affinity map.
func fillsAffinity(rs *m.Ruleset) bool {
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, e := range r.Exprs {
				if _, ok := e.(m.UpdateMap); ok {
					return true
				}
			}
		}
	}
	return false
}

// applyAndList applies rs over netlink in ns and checks that nft lists it
// as rendered.
func applyAndList(t *testing.T, ns *netns.NS, rs *m.Ruleset, text string) {
	t.Helper()
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := nftnl.Apply(conn, rs); err != nil {
		t.Fatalf("apply the %s ruleset: %v\n%s", rs.Family, err, text)
	}
	got, err := ns.Exec("nft", "list", "table", rs.Family.String(), rs.Table)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(text, got); diff != "" {
		t.Errorf("nft list table differs from the render (-render +listed):\n%s", diff)
	}
}
