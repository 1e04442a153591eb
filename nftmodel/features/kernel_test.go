package features

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

var bothFamilies = []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6}

// Every probe passes on this kernel in a fresh namespace, leaves no table
// behind and leaves another program's table as it was.
func TestProbesPassAndLeaveNothing(t *testing.T) {
	ns := netns.New(t, "npfeat")
	const other = "table ip other {\n\tchain c {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\n"
	file := filepath.Join(t.TempDir(), "other.nft")
	if err := os.WriteFile(file, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Exec("nft", "-f", file); err != nil {
		t.Fatal(err)
	}
	p := NewProber(ns.Fd(), bothFamilies...)
	start := time.Now()
	for _, f := range append(Ruleset(), ConntrackNetlink) {
		if err := p.Probe(f); err != nil {
			t.Errorf("Probe(%s) = %v", f, err)
		}
	}
	t.Logf("%d probes, both families: %v", len(Ruleset())+1, time.Since(start))
	out, err := ns.Exec("nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	if out != other {
		t.Errorf("ruleset after probing:\n%s\nwant only the other program's table:\n%s", out, other)
	}
}

// A feature the kernel lacks is refused with its name, its minimum kernel
// and the object refused, whether the kernel refuses it while preparing the
// batch (a nat chain on a hook nat has no chains on) or while committing it (masquerade outside a nat postrouting
// chain, found by the hook check that a table deleted in the same batch
// would skip), and its probe table is gone too.
func TestMissingFeatureNamed(t *testing.T) {
	ns := netns.New(t, "npfeat")
	tests := []struct {
		name, verb string
		program    func(b *build)
	}{
		{"nat chains on forward", "add chain c", func(b *build) {
			b.chain("c", nftmodel.TypeNAT, nftmodel.HookForward, prioFilter)
		}},
		{"masquerade on input", "add rule 1 to chain input", func(b *build) {
			in := b.chain("input", nftmodel.TypeFilter, nftmodel.HookInput, prioFilter)
			rule(in, nftmodel.Masquerade{})
		}},
	}
	p := NewProber(ns.Fd(), bothFamilies...)
	for _, tt := range tests {
		err := p.Probe(&Feature{Name: tt.name, MinKernel: "99.1", program: tt.program})
		var u *UnsupportedError
		if !errors.As(err, &u) || !errors.Is(err, ErrNotSupported) {
			t.Errorf("Probe(%s) = %v, want an UnsupportedError", tt.name, err)
			continue
		}
		for _, part := range []string{tt.name, "Linux 99.1", tt.verb} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("error %q does not say %q", err, part)
			}
		}
		t.Logf("Probe(%s) = %v", tt.name, err)
	}
	if out, err := ns.Exec("nft", "list", "ruleset"); err != nil || out != "" {
		t.Errorf("ruleset after refused probes: %q, %v; want it empty", out, err)
	}
}

var update = flag.Bool("update", false, "rewrite testdata/probes.nft")

// Each probe programs what its feature names, in nft's words: the tables
// the probes commit, kept and listed by nft, equal testdata/probes.nft.
func TestProbesProgramWhatTheyName(t *testing.T) {
	ns := netns.New(t, "npfeat")
	p := NewProber(ns.Fd(), bothFamilies...)
	var got strings.Builder
	for _, f := range Ruleset() {
		if f.program == nil {
			continue
		}
		name := p.tableName()
		if err := p.programTable(name, f.program, true); err != nil {
			t.Fatalf("program %s: %v", f, err)
		}
		fmt.Fprintf(&got, "# %s (Linux %s)\n", f.Name, f.MinKernel)
		for _, fam := range []string{"ip", "ip6"} {
			out, err := ns.Exec("nft", "list", "table", fam, name)
			if err != nil {
				t.Fatal(err)
			}
			got.WriteString(strings.ReplaceAll(out, name, "probe"))
			if _, err := ns.Exec("nft", "delete", "table", fam, name); err != nil {
				t.Fatal(err)
			}
		}
	}
	golden := filepath.Join("testdata", "probes.nft")
	if *update {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), got.String()); diff != "" {
		t.Errorf("probe tables differ from %s (-want +got):\n%s", golden, diff)
	}
}

// A prober that dies between its batches leaves nothing behind: the
// probe table is owned by the probe's socket, and the kernel removes it
// when the socket closes.
func TestProbeTableGoesWithItsSocket(t *testing.T) {
	ns := netns.New(t, "npfeat")
	p := NewProber(ns.Fd(), bothFamilies...)
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	name := p.tableName()
	for _, fam := range bothFamilies {
		if err := nftnl.Create(conn, p.ruleset(fam, name, NATChains.program), true); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := ns.Exec("nft", "list", "tables"); err != nil || strings.Count(out, "nftproxy-probe-") != 2 {
		t.Fatalf("tables after the first batch: %q, %v; want the two probe tables", out, err)
	}
	_ = conn.Close() // as the process's death would
	if out, err := ns.Exec("nft", "list", "ruleset"); err != nil || out != "" {
		t.Errorf("ruleset after the probe's socket closed: %q, %v; want it empty", out, err)
	}
}

// PrivateNetns gives a namespace that is not the caller's, the caller stays
// where it was, and every probe passes there.
func TestPrivateNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	var before, after, private unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &before); err != nil {
		t.Fatal(err)
	}
	fd, err := PrivateNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Close(fd) }()
	if err := unix.Fstat(fd, &private); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/net", &after); err != nil {
		t.Fatal(err)
	}
	if private.Ino == before.Ino {
		t.Error("PrivateNetns gave the caller's own namespace")
	}
	if after.Ino != before.Ino {
		t.Error("the process left its namespace")
	}
	if err := NewProber(fd, bothFamilies...).Check(append(Ruleset(), ConntrackNetlink)...); err != nil {
		t.Errorf("probes in the private namespace: %v", err)
	}
}

// A probe table is dormant: the kernel still refuses a rule its chain
// cannot hold (masquerade outside a nat chain), and a drop rule in its
// output base chain drops nothing, as its hooks are not registered.
func TestProbeTableIsDormant(t *testing.T) {
	ns := netns.New(t, "npdorm")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	table := func(hook nftmodel.Hook, e nftmodel.Expr) *nftmodel.Ruleset {
		return &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "dormant", Chains: []*nftmodel.Chain{{Name: "c",
			Base:  &nftmodel.BaseChain{Type: nftmodel.TypeFilter, Hook: hook},
			Rules: []nftmodel.Rule{{Exprs: []nftmodel.Expr{e}}}}}}
	}
	if err := nftnl.Create(conn, table(nftmodel.HookPostrouting, nftmodel.Masquerade{}), false); err == nil {
		t.Fatal("masquerade in a dormant filter chain: accepted, want the kernel to refuse it")
	}
	if err := nftnl.Create(conn, table(nftmodel.HookOutput, nftmodel.Verdict{Kind: nftmodel.Drop}), false); err != nil {
		t.Fatal(err)
	}
	if out, err := ns.Exec("nft", "list", "table", "ip", "dormant"); err != nil || !strings.Contains(out, "flags dormant") {
		t.Fatalf("probe table: %q, %v; want it dormant", out, err)
	}
	stop, err := ns.ServeName("lo", "tcp", 7070)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if name, err := ns.AskTCP(ctx, netip.MustParseAddrPort("127.0.0.1:7070")); err != nil || name != "lo" {
		t.Errorf("a connection past a dormant table's drop rule: %q, %v; want it answered", name, err)
	}
}
