package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// kubeProxyIPv4 is what kube-proxy's iptables mode (and kubelet) leave in
// an IPv4 namespace serving one ClusterIP/NodePort service, beside another
// program's chain and rules.
const kubeProxyIPv4 = `*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:OTHER-INPUT - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A INPUT -s 192.0.2.0/24 -j OTHER-INPUT
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A OTHER-INPUT -p tcp -m tcp --dport 22 -m comment --comment "someone's \"ssh\" -j KUBE-SERVICES" -j ACCEPT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-LOLE4ISW44XBNF3G - [0:0]
:KUBE-SEP-7GB5MCKFYLQ4EWGB - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXT-LOLE4ISW44XBNF3G - [0:0]
:OTHER-POST - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -j OTHER-POST
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-LOLE4ISW44XBNF3G
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j KUBE-EXT-LOLE4ISW44XBNF3G
-A KUBE-EXT-LOLE4ISW44XBNF3G -j KUBE-MARK-MASQ
-A KUBE-EXT-LOLE4ISW44XBNF3G -j KUBE-SVC-LOLE4ISW44XBNF3G
-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web:http -> 10.244.1.2:8080" -j KUBE-SEP-7GB5MCKFYLQ4EWGB
-A KUBE-SEP-7GB5MCKFYLQ4EWGB -s 10.244.1.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-7GB5MCKFYLQ4EWGB -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A OTHER-POST -s 10.99.0.0/16 -j MASQUERADE
COMMIT
`

const kubeProxyIPv6 = `*mangle
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s fd99::/64 -j MASQUERADE
-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
COMMIT
*filter
:OTHER - [0:0]
-A INPUT -j OTHER
COMMIT
`

// otherTables are nftables tables of other programs, and kube-proxy's.
const otherTables = `table inet other {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
	}
}
table ip kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
	}
}
table ip6 kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
	}
}
`

// kept drops, from iptables-save output, the comment lines and every line
// that declares, fills or jumps to a chain of kube-proxy's (written out
// here, not with IsChain): what must be left after the cleanup.
func kept(save string) string {
	kubelet := strings.NewReplacer("KUBE-FIREWALL", "", "KUBE-KUBELET-CANARY", "", "KUBE-IPTABLES-HINT", "", `-j KUBE-SERVICES"`, "")
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") || strings.Contains(kubelet.Replace(l), "KUBE-") {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

func iptablesSave(t *testing.T, ns *netns.NS, tool string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns.Name(), tool).Output()
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return string(out)
}

func restore(t testing.TB, ns *netns.NS, tool, input string) {
	t.Helper()
	args := []string{"netns", "exec", ns.Name(), tool}
	if tool == "nft" {
		args = append(args, "-f", "-")
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", tool, err, out)
	}
}

// cleanupWithPath runs CleanupIPTables in ns with PATH set to path, as
// nftproxy's image has it (no iptables tools) or as a host has it.
func cleanupWithPath(t *testing.T, ns *netns.NS, path string) ([]string, *observer.ObservedLogs) {
	t.Helper()
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	core, logs := observer.New(zap.InfoLevel)
	old := os.Getenv("PATH")
	os.Setenv("PATH", path)
	defer os.Setenv("PATH", old)
	var removed []string
	err = ns.Do(func() error {
		// Children inherit the locked thread's namespace.
		var err error
		removed, err = CleanupIPTables(context.Background(), conn, zap.New(core))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return removed, logs
}

// TestCleanupInNamespace loads kube-proxy's and kubelet's chains beside
// another program's, in one iptables backend, plus kube-proxy's nftables
// tables beside another's, into a fresh namespace; the cleanup removes
// exactly kube-proxy's, and a second run finds nothing to do. Neither
// backend needs an iptables tool on the PATH: the nft backend's go over
// netlink, the legacy backend's by replacing each table over a raw socket.
func TestCleanupInNamespace(t *testing.T) {
	noTools := t.TempDir()
	for _, tc := range []struct{ name, backend, path string }{
		{"legacy", "legacy", noTools},
		{"nft", "nft", noTools},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backend := tc.backend
			for _, tool := range []string{"iptables-" + backend + "-restore", "nft"} {
				if _, err := exec.LookPath(tool); err != nil {
					t.Skipf("skipping: %s not installed (apt-get install iptables nftables)", tool)
				}
			}
			ns := netns.New(t, "kpc")
			restore(t, ns, "iptables-"+backend+"-restore", kubeProxyIPv4)
			restore(t, ns, "ip6tables-"+backend+"-restore", kubeProxyIPv6)
			restore(t, ns, "nft", otherTables)
			saves := []string{"iptables-" + backend + "-save", "ip6tables-" + backend + "-save"}
			before := map[string]string{}
			for _, tool := range saves {
				before[tool] = iptablesSave(t, ns, tool)
			}

			removed, _ := cleanupWithPath(t, ns, tc.path)
			conn, err := nftnl.Dial(ns.Fd())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			if err := DeleteTables(conn); err != nil {
				t.Fatal(err)
			}
			tables, err := ns.Exec("nft", "list", "tables")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table inet other") {
				t.Errorf("nftables tables after the cleanup:\n%s", tables)
			}

			want := []string{
				"iptables-" + backend + ": mangle/KUBE-PROXY-CANARY",
				"iptables-" + backend + ": nat/KUBE-SEP-7GB5MCKFYLQ4EWGB",
				"ip6tables-" + backend + ": nat/KUBE-SVC-AAAAAAAAAAAAAAAA",
			}
			for _, w := range want {
				if !slices.Contains(removed, w) {
					t.Errorf("removed %q, lacks %q", removed, w)
				}
			}
			if len(removed) != 13+4 {
				t.Errorf("removed %d chains, want 17: %q", len(removed), removed)
			}
			for _, tool := range saves {
				after := iptablesSave(t, ns, tool)
				if diff := cmp.Diff(kept(before[tool]), kept(after)); diff != "" {
					t.Errorf("%s: other chains and rules changed (-want +got):\n%s", tool, diff)
				}
				if strings.Contains(strings.NewReplacer("KUBE-FIREWALL", "", "KUBE-KUBELET-CANARY", "", "KUBE-IPTABLES-HINT", "", `-j KUBE-SERVICES"`, "").Replace(after), "KUBE-") {
					t.Errorf("%s: kube-proxy's chains left:\n%s", tool, after)
				}
			}

			// Nothing left to do.
			if removed, _ = cleanupWithPath(t, ns, tc.path); len(removed) != 0 {
				t.Errorf("second cleanup: removed %q", removed)
			}
		})
	}
}

// TestReplacerOneTransaction applies nftproxy's first ruleset through the
// Replacer into a namespace holding kube-proxy's tables: one commit per
// family replaces them, and the iptables cleanup runs once, after the last
// family.
func TestReplacerOneTransaction(t *testing.T) {
	ns := netns.New(t, "kpr")
	restore(t, ns, "nft", otherTables)
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	var calls []string
	r := &Replacer{Kernel: nftnl.Kernel{Conn: conn}, Families: 2, Logger: zaptest.NewLogger(t),
		IPTables: func() error { calls = append(calls, "iptables"); return nil }}
	for i, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		before, err := r.Generation()
		if err != nil {
			t.Fatal(err)
		}
		rs := &nftmodel.Ruleset{Family: f, Table: proxier.TableName}
		if _, err := r.Apply(rs); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
		after, err := r.Generation()
		if err != nil {
			t.Fatal(err)
		}
		if after-before != 1 {
			t.Errorf("%s: %d commits, want 1", f, after-before)
		}
		tables, err := ns.Exec("nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		want := "table inet other\n"
		if i == 0 {
			want += "table ip6 kube-proxy\ntable ip nftproxy\n"
		} else {
			want += "table ip nftproxy\ntable ip6 nftproxy\n"
		}
		if got := sortedLines(tables); got != sortedLines(want) {
			t.Errorf("after %s: tables\n%s\nwant\n%s", f, got, sortedLines(want))
		}
		if wantCalls := i; len(calls) != wantCalls {
			t.Errorf("after %s: iptables cleanup ran %d times, want %d", f, len(calls), wantCalls)
		}
	}
	// Later full syncs don't run it again.
	if _, err := r.Apply(&nftmodel.Ruleset{Family: nftmodel.IPv4, Table: proxier.TableName}); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 {
		t.Errorf("iptables cleanup ran %d times, want once", len(calls))
	}
}

func sortedLines(s string) string {
	lines := strings.Fields(strings.ReplaceAll(s, "table ", "table_"))
	slices.Sort(lines)
	return fmt.Sprint(lines)
}

// kubeProxyServices is iptables-restore input for what kube-proxy's
// iptables mode writes for n ClusterIP services of two endpoints each: per
// service a KUBE-SVC chain and two KUBE-SEP chains, with the rules joining
// them.
func kubeProxyServices(n int) string {
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n")
	for i := range n {
		fmt.Fprintf(&b, ":KUBE-SVC-%016X - [0:0]\n:KUBE-SEP-%016XA - [0:0]\n:KUBE-SEP-%016XB - [0:0]\n", i, i, i)
	}
	b.WriteString("-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := range n {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-%016X\n", ip, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X -m statistic --mode random --probability 0.5 -j KUBE-SEP-%016XA\n", i, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%016X -j KUBE-SEP-%016XB\n", i, i)
		for _, e := range []string{"A", "B"} {
			fmt.Fprintf(&b, "-A KUBE-SEP-%016X%s -s 10.244.%d.%d/32 -j KUBE-MARK-MASQ\n", i, e, i/250, i%250+1)
			fmt.Fprintf(&b, "-A KUBE-SEP-%016X%s -p tcp -m tcp -j DNAT --to-destination 10.244.%d.%d:8080\n", i, e, i/250, i%250+1)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// BenchmarkCleanupNFT removes the iptables-nft chains kube-proxy leaves
// for 1,000 and 5,000 services (3 chains, 7 rules each) over netlink.
func BenchmarkCleanupNFT(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			input := kubeProxyServices(n)
			for b.Loop() {
				b.StopTimer()
				ns := netns.New(b, "kpb")
				restore(b, ns, "iptables-nft-restore", input)
				conn, err := nftnl.Dial(ns.Fd())
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				removed, err := CleanupNFT(conn)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if len(removed) != 3*n+3 {
					b.Fatalf("removed %d chains, want %d", len(removed), 3*n+3)
				}
				_ = conn.Close()
				b.StartTimer()
			}
		})
	}
}

// TestApplyNFTStaleGeneration: a batch planned before another program's
// commit is refused as a whole with ERESTART (which CleanupNFT retries),
// and changes nothing.
func TestApplyNFTStaleGeneration(t *testing.T) {
	if _, err := exec.LookPath("iptables-nft-restore"); err != nil {
		t.Skip("skipping: iptables-nft-restore not installed (apt-get install iptables)")
	}
	ns := netns.New(t, "kps")
	restore(t, ns, "iptables-nft-restore", kubeProxyIPv4)
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	gen, err := nftnl.Generation(conn)
	if err != nil {
		t.Fatal(err)
	}
	listing, err := ListNFT(conn)
	if err != nil {
		t.Fatal(err)
	}
	before := iptablesSave(t, ns, "iptables-nft-save")
	restore(t, ns, "nft", "add table inet someone\n")
	err = applyNFT(conn, PlanNFT(listing), gen)
	if !errors.Is(err, unix.ERESTART) {
		t.Fatalf("applyNFT with a stale generation: %v, want ERESTART", err)
	}
	if after := iptablesSave(t, ns, "iptables-nft-save"); kept(after) != kept(before) || !strings.Contains(after, ":KUBE-SERVICES") {
		t.Errorf("a refused batch changed the ruleset:\n%s", after)
	}
	removed, err := CleanupNFT(conn)
	if err != nil || len(removed) != 13 {
		t.Errorf("CleanupNFT after the refusal: removed %d chains (%v), want 13", len(removed), err)
	}
}

// TestLegacyCleanupKeepsCounters: the legacy table is replaced whole, as
// iptables-legacy-restore replaces it; the rules and policies kept keep
// their packet and byte counters, as they do under the tools.
func TestLegacyCleanupKeepsCounters(t *testing.T) {
	if _, err := exec.LookPath("iptables-legacy-restore"); err != nil {
		t.Skip("skipping: iptables-legacy-restore not installed (apt-get install iptables)")
	}
	ns := netns.New(t, "kpk")
	cmd := exec.Command("ip", "netns", "exec", ns.Name(), "iptables-legacy-restore", "-c")
	cmd.Stdin = strings.NewReader(`*filter
:INPUT ACCEPT [11:660]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:OTHER - [0:0]
[5:300] -A INPUT -j KUBE-SERVICES
[7:420] -A INPUT -s 192.0.2.0/24 -j OTHER
[2:120] -A KUBE-SERVICES -d 10.96.0.10/32 -j REJECT
[3:180] -A OTHER -p tcp -m tcp --dport 22 -j ACCEPT
[4:240] -A OUTPUT -j OTHER
COMMIT
`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-legacy-restore: %v: %s", err, out)
	}
	removed, _ := cleanupWithPath(t, ns, t.TempDir())
	if want := []string{"iptables-legacy: filter/KUBE-SERVICES"}; !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	out, err := exec.Command("ip", "netns", "exec", ns.Name(), "iptables-legacy-save", "-c", "-t", "filter").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			got = append(got, l)
		}
	}
	want := []string{"*filter", ":INPUT ACCEPT [11:660]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]", ":OTHER - [0:0]",
		"[7:420] -A INPUT -s 192.0.2.0/24 -j OTHER", "[4:240] -A OUTPUT -j OTHER", "[3:180] -A OTHER -p tcp -m tcp --dport 22 -j ACCEPT", "COMMIT"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("iptables-legacy-save -c after the cleanup (-want +got):\n%s", diff)
	}
}
