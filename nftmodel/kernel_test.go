package nftmodel

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// The kernel tests need root and create their own network namespaces; they
// skip otherwise (netns.New does the skipping).

// nftNS is a fresh namespace with a connection made by Dial.
func nftNS(t *testing.T) (*netns.NS, *nftables.Conn) {
	t.Helper()
	ns := netns.New(t, "nftmodel")
	conn, err := Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.CloseLasting() })
	return ns, conn
}

// loadText loads nft text with `nft -f` in ns.
func loadText(t *testing.T, ns *netns.NS, text string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "ruleset.nft")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Exec("nft", "-f", file); err != nil {
		t.Fatalf("load rendered text: %v\n%s", err, text)
	}
}

// listTable returns what `nft list table` prints for the ruleset's table.
func listTable(t *testing.T, ns *netns.NS, rs *Ruleset) string {
	t.Helper()
	out, err := ns.Exec("nft", "list", "table", rs.Family.String(), rs.Table)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDifferential is the applier's contract: for each ruleset, the text
// Render prints loaded with `nft -f` in one namespace, and the same ruleset
// applied over netlink in another, list identically, and both list exactly
// as Render printed.
func TestDifferential(t *testing.T) {
	for _, rs := range []*Ruleset{fullRuleset(), full6Ruleset(), bigSetRuleset(1200)} {
		t.Run(rs.Family.String()+"/"+rs.Table, func(t *testing.T) {
			text := Render(rs)
			nsText, _ := nftNS(t)
			loadText(t, nsText, text)
			fromText := listTable(t, nsText, rs)

			nsNetlink, conn := nftNS(t)
			if _, err := Apply(conn, rs); err != nil {
				t.Fatal(err)
			}
			fromNetlink := listTable(t, nsNetlink, rs)

			if d := gocmp.Diff(fromText, fromNetlink); d != "" {
				t.Errorf("nft -f and netlink list differently (-nft +netlink):\n%s", d)
			}
			if d := gocmp.Diff(text, fromText); d != "" {
				t.Errorf("Render and nft's listing differ (-render +nft):\n%s", d)
			}

			// Applying again replaces the table: same listing.
			if _, err := Apply(conn, rs); err != nil {
				t.Fatal(err)
			}
			if d := gocmp.Diff(fromNetlink, listTable(t, nsNetlink, rs)); d != "" {
				t.Errorf("second Apply changed the listing:\n%s", d)
			}
		})
	}
}

// changedRuleset edits fullRuleset in every way Diff can express: elements
// added, removed and changed, a chain added and one removed, chains
// rewritten, a set added and one removed.
func changedRuleset() *Ruleset {
	rs := fullRuleset()
	for _, s := range rs.Sets {
		switch s.Name {
		case "service-ips":
			s.Elements = slices.DeleteFunc(s.Elements, func(e Element) bool { return e.Verdict.Kind == Drop })
			s.Elements[0].Comment = "default/web:http renamed"
			s.Elements = append(s.Elements, Element{Key: nlKey("10.96.0.20", 6, 8443), Comment: "default/new:https", Verdict: nlGoto("svc-new")})
		case "endpoints":
			s.Elements[1].Data = []Value{A(ip("10.244.2.4")), N(5353)}
		}
	}
	rs.Sets = slices.DeleteFunc(rs.Sets, func(s *Set) bool { return s.Name == "protos" })
	rs.Sets = append(rs.Sets, &Set{Name: "new-set", Key: []DataType{TypeIPv4Addr}, Elements: []Element{{Key: []Value{A(ip("10.1.2.3"))}, Comment: "new"}}})
	rs.Chains = slices.DeleteFunc(rs.Chains, func(c *Chain) bool { return c.Name == "ep-web-3" || c.Name == "empty" })
	for _, c := range rs.Chains {
		switch c.Name {
		case "svc-web":
			c.Rules[1] = Rule{Exprs: []Expr{NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2"}}}, Comment: "default/web:http"}
		case "services":
			c.Rules[4] = Rule{Exprs: []Expr{MatchSet{Key: []Field{FieldDaddr}, Set: "new-set"}, Verdict{Kind: Accept}}, Comment: "sets"}
		}
	}
	rs.Chains = append(rs.Chains,
		&Chain{Name: "svc-new", Rules: []Rule{nlRule(NumgenGoto{Chains: []string{"ep-new"}})}},
		&Chain{Name: "ep-new", Rules: []Rule{nlRule(DNAT{Proto: 6, Addr: ip("10.244.3.1"), Port: 8443})}},
	)
	return rs
}

// kernelOrder reorders desired the way the kernel keeps a table that was
// changed from applied: objects that already existed stay in applied's order
// and new ones come after them, in the order they were added. Render of the
// result is what `nft list table` prints after ApplyChanges.
func kernelOrder(applied, desired *Ruleset) *Ruleset {
	out := *desired
	out.Sets = orderLike(applied.Sets, desired.Sets, func(s *Set) string { return s.Name })
	out.Chains = orderLike(applied.Chains, desired.Chains, func(c *Chain) string { return c.Name })
	return &out
}

func orderLike[T any](old, now []T, name func(T) string) []T {
	pos := map[string]int{}
	for i, o := range old {
		pos[name(o)] = i
	}
	out := slices.Clone(now)
	slices.SortStableFunc(out, func(a, b T) int {
		pa, oka := pos[name(a)]
		pb, okb := pos[name(b)]
		switch {
		case oka && okb:
			return pa - pb
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
	return out
}

// TestApplyChanges applies a ruleset, then the diff to another, and checks
// the kernel lists the second one: exactly as Render prints it once new sets
// and chains are moved to the end (see kernelOrder).
func TestApplyChanges(t *testing.T) {
	tests := []struct {
		name     string
		from, to *Ruleset
	}{
		{name: "every kind of change", from: fullRuleset(), to: changedRuleset()},
		{name: "and back", from: changedRuleset(), to: fullRuleset()},
		{name: "one endpoint changes", from: bigSetRuleset(1200), to: func() *Ruleset {
			rs := bigSetRuleset(1200)
			rs.Sets[0].Elements[600].Data = []Value{A(ip("10.244.99.99")), N(9090)}
			return rs
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes, ok := Diff(tt.from, tt.to)
			if !ok {
				t.Fatal("Diff: not incremental")
			}
			ns, conn := nftNS(t)
			if _, err := Apply(conn, tt.from); err != nil {
				t.Fatal(err)
			}
			if _, err := ApplyChanges(conn, tt.to.Family, tt.to.Table, &changes); err != nil {
				t.Fatal(err)
			}
			want := Render(kernelOrder(tt.from, tt.to))
			if d := gocmp.Diff(want, listTable(t, ns, tt.to)); d != "" {
				t.Errorf("listing after ApplyChanges (-want +got):\n%s", d)
			}
		})
	}
}

// TestApplyErrorNamesObject checks that a batch the kernel refuses leaves the
// table as it was and that the error names the refused object.
func TestApplyErrorNamesObject(t *testing.T) {
	ns, conn := nftNS(t)
	rs := fullRuleset()
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	before := listTable(t, ns, rs)

	bad := fullRuleset()
	bad.Chains[len(bad.Chains)-1].Rules = []Rule{nlRule(nlJump("no-such-chain"))}
	_, err := Apply(conn, bad)
	if err == nil {
		t.Fatal("Apply with a jump to a missing chain succeeded")
	}
	t.Logf("refused: %v", err)
	if want := "add rule 1 to chain empty: jump no-such-chain"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
	if after := listTable(t, ns, rs); after != before {
		t.Errorf("refused batch changed the table:\n%s", gocmp.Diff(before, after))
	}

	// The connection is still good for the next batch.
	if _, err := Apply(conn, rs); err != nil {
		t.Fatalf("Apply after a refused batch: %v", err)
	}
}

// TestDelete removes the table and is a no-op when it's gone.
func TestDelete(t *testing.T) {
	ns, conn := nftNS(t)
	rs := full6Ruleset()
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Delete(conn, rs.Family, rs.Table); err != nil {
			t.Fatal(err)
		}
	}
	out, err := ns.Exec("nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("tables left after Delete: %q", out)
	}
}

// TestApplyLargeBatch sends a batch of about 8 MB (60,000 elements with
// comments and 10,000 rules, each echoed back by the kernel), far past the
// default socket buffers, and checks everything arrived.
func TestApplyLargeBatch(t *testing.T) {
	_, conn := nftNS(t)
	const elements, rules = 60000, 10000
	rs := bigSetRuleset(elements)
	c := &Chain{Name: "many-rules"}
	for i := range rules {
		addr := ip(fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255))
		c.Rules = append(c.Rules, Rule{Exprs: []Expr{DNAT{Proto: 6, Addr: addr, Port: 8080}}, Comment: fmt.Sprintf("namespace-%d/service-%d:http", i, i)})
	}
	rs.Chains = append(rs.Chains, c)
	stats, err := Apply(conn, rs)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Elements != elements || stats.Rules != rules {
		t.Errorf("stats = %+v", stats)
	}
	table := &nftables.Table{Name: rs.Table, Family: nftables.TableFamilyIPv4}
	got, err := conn.GetSetElements(&nftables.Set{Table: table, Name: "endpoints"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != elements {
		t.Errorf("kernel holds %d elements, want %d", len(got), elements)
	}
	kernelRules, err := conn.GetRules(table, &nftables.Chain{Name: c.Name, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if len(kernelRules) != rules {
		t.Errorf("kernel holds %d rules, want %d", len(kernelRules), rules)
	}
}
