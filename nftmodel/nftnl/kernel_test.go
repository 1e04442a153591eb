package nftnl

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/nftmodel"
)

// The kernel tests need root and create their own network namespaces; they
// skip otherwise (netns.New does the skipping).

// nftNS is a fresh namespace with a connection made by Dial.
func nftNS(t *testing.T) (*netns.NS, *Conn) {
	t.Helper()
	ns := netns.New(t, "nftmodel")
	conn, err := Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
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
func listTable(t *testing.T, ns *netns.NS, rs *nftmodel.Ruleset) string {
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
	for _, rs := range []*nftmodel.Ruleset{fullRuleset(), full6Ruleset(), bigSetRuleset(1200), sizedSetRuleset(300), sourcedSetRuleset(3000)} {
		t.Run(rs.Family.String()+"/"+rs.Table, func(t *testing.T) {
			text := nftmodel.Render(rs)
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
			// Read gives the listing back without nft. (Only from the
			// netlink side: for a few texts nft writes another program
			// that lists the same, such as a TCP reset's implied protocol
			// match first, which Read's check against Apply refuses.)
			read, err := Read(conn, rs.Family, rs.Table)
			if err != nil {
				t.Fatalf("read the table back: %v", err)
			}
			if d := gocmp.Diff(text, nftmodel.Render(read)); d != "" {
				t.Errorf("table read back (-render +read):\n%s", d)
			}

			// Applying again refills the table in place: same listing.
			if _, err := Apply(conn, rs); err != nil {
				t.Fatal(err)
			}
			if d := gocmp.Diff(fromNetlink, listTable(t, nsNetlink, rs)); d != "" {
				t.Errorf("second Apply changed the listing:\n%s", d)
			}
		})
	}
}

// TestUpdateMapIPv6ListsAsRendered checks an IPv6 UpdateMap, which nft
// 1.0.6 can't load from text (its registers run out: "dreg <
// ctx->reg_low"), the other way only: applied over netlink, it lists as
// Render prints it and reads back.
func TestUpdateMapIPv6ListsAsRendered(t *testing.T) {
	rs := &nftmodel.Ruleset{Family: nftmodel.IPv6, Table: "nftproxy-test6", Sets: []*nftmodel.Set{clientAffinity(nftmodel.TypeIPv6Addr)},
		Chains: []*nftmodel.Chain{affinityChain()}}
	rs.Chains[0].Rules = slices.DeleteFunc(rs.Chains[0].Rules, func(r nftmodel.Rule) bool {
		_, vmap := r.Exprs[len(r.Exprs)-1].(nftmodel.VerdictMap) // no service-ips here
		return vmap
	})
	ns, conn := nftNS(t)
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	text := nftmodel.Render(rs)
	if d := gocmp.Diff(text, listTable(t, ns, rs)); d != "" {
		t.Errorf("Render and nft's listing differ (-render +nft):\n%s", d)
	}
	read, err := Read(conn, rs.Family, rs.Table)
	if err != nil {
		t.Fatalf("read the table back: %v", err)
	}
	if d := gocmp.Diff(text, nftmodel.Render(read)); d != "" {
		t.Errorf("table read back (-render +read):\n%s", d)
	}
}

// changedRuleset edits fullRuleset in every way Diff can express: elements
// added, removed and changed, a chain added and one removed, chains
// rewritten, a set added and one removed.
func changedRuleset() *nftmodel.Ruleset {
	rs := fullRuleset()
	for _, s := range rs.Sets {
		switch s.Name {
		case "service-ips":
			s.Elements = slices.DeleteFunc(s.Elements, func(e nftmodel.Element) bool { return e.Verdict.Kind == nftmodel.Drop })
			s.Elements[0].Comment = "default/web:http renamed"
			s.Elements = append(s.Elements, nftmodel.Element{Key: nlKey("10.96.0.20", 6, 8443), Comment: "default/new:https", Verdict: nlGoto("svc-new")})
		case "endpoints":
			s.Elements[1].Data = []nftmodel.Value{nftmodel.A(ip("10.244.2.4")), nftmodel.N(5353)}
		}
	}
	rs.Sets = slices.DeleteFunc(rs.Sets, func(s *nftmodel.Set) bool { return s.Name == "protos" })
	rs.Sets = append(rs.Sets, &nftmodel.Set{Name: "new-set", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr}, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(ip("10.1.2.3"))}, Comment: "new"}}})
	rs.Chains = slices.DeleteFunc(rs.Chains, func(c *nftmodel.Chain) bool { return c.Name == "ep-web-3" || c.Name == "empty" })
	for _, c := range rs.Chains {
		switch c.Name {
		case "svc-web":
			c.Rules[1] = nftmodel.Rule{Exprs: []nftmodel.Expr{nftmodel.NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2"}}}, Comment: "default/web:http"}
		case "services":
			c.Rules[4] = nftmodel.Rule{Exprs: []nftmodel.Expr{nftmodel.MatchSet{Key: []nftmodel.Field{nftmodel.FieldDaddr}, Set: "new-set"}, nftmodel.Verdict{Kind: nftmodel.Accept}}, Comment: "sets"}
		}
	}
	rs.Chains = append(rs.Chains,
		&nftmodel.Chain{Name: "svc-new", Rules: []nftmodel.Rule{nlRule(nftmodel.NumgenGoto{Chains: []string{"ep-new"}})}},
		&nftmodel.Chain{Name: "ep-new", Rules: []nftmodel.Rule{nlRule(nftmodel.DNAT{Proto: 6, Addr: ip("10.244.3.1"), Port: 8443})}},
	)
	return rs
}

// kernelOrder reorders desired the way the kernel keeps a table that was
// changed from applied: objects that already existed stay in applied's order
// and new ones come after them, in the order they were added. Render of the
// result is what `nft list table` prints after ApplyChanges.
func kernelOrder(applied, desired *nftmodel.Ruleset) *nftmodel.Ruleset {
	out := *desired
	out.Sets = orderLike(applied.Sets, desired.Sets, func(s *nftmodel.Set) string { return s.Name })
	out.Chains = orderLike(applied.Chains, desired.Chains, func(c *nftmodel.Chain) string { return c.Name })
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
		from, to *nftmodel.Ruleset
	}{
		{name: "every kind of change", from: fullRuleset(), to: changedRuleset()},
		{name: "and back", from: changedRuleset(), to: fullRuleset()},
		{name: "one endpoint changes", from: bigSetRuleset(1200), to: func() *nftmodel.Ruleset {
			rs := bigSetRuleset(1200)
			rs.Sets[0].Elements[600].Data = []nftmodel.Value{nftmodel.A(ip("10.244.99.99")), nftmodel.N(9090)}
			return rs
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes, ok := nftmodel.Diff(tt.from, tt.to)
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
			want := nftmodel.Render(kernelOrder(tt.from, tt.to))
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
	bad.Chains[len(bad.Chains)-1].Rules = []nftmodel.Rule{nlRule(nlJump("no-such-chain"))}
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
	c := &nftmodel.Chain{Name: "many-rules"}
	for i := range rules {
		addr := ip(fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255))
		c.Rules = append(c.Rules, nftmodel.Rule{Exprs: []nftmodel.Expr{nftmodel.DNAT{Proto: 6, Addr: addr, Port: 8080}}, Comment: fmt.Sprintf("namespace-%d/service-%d:http", i, i)})
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
	got, err := conn.lib.GetSetElements(&nftables.Set{Table: table, Name: "endpoints"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != elements {
		t.Errorf("kernel holds %d elements, want %d", len(got), elements)
	}
	kernelRules, err := conn.lib.GetRules(table, &nftables.Chain{Name: c.Name, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if len(kernelRules) != rules {
		t.Errorf("kernel holds %d rules, want %d", len(kernelRules), rules)
	}
}

// nft runs nft in ns with args and fails the test on error.
func nft(t *testing.T, ns *netns.NS, args ...string) {
	t.Helper()
	if out, err := ns.Exec(append([]string{"nft"}, args...)...); err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// setKeys returns the first key part of every element the kernel holds in
// the named set, whose key must start with an address.
func setKeys(t *testing.T, conn *Conn, rs *nftmodel.Ruleset, set string) []netip.Addr {
	t.Helper()
	table := &nftables.Table{Name: rs.Table, Family: nftables.TableFamilyIPv4}
	size := 4
	if rs.Family == nftmodel.IPv6 {
		table.Family, size = nftables.TableFamilyIPv6, 16
	}
	els, err := conn.lib.GetSetElements(&nftables.Set{Table: table, Name: set})
	if err != nil {
		t.Fatalf("get elements of set %s: %v", set, err)
	}
	var out []netip.Addr
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key[:size])
		out = append(out, a)
	}
	return out
}

// afterFullApply is desired in the order the kernel keeps it after a full
// Apply over a table that held applied: sets and chains that stayed keep
// applied's order, and the new and recreated ones (named in recreated)
// follow in desired's order.
func afterFullApply(applied, desired *nftmodel.Ruleset, recreated ...string) *nftmodel.Ruleset {
	stayed := *applied
	stayed.Sets = slices.DeleteFunc(slices.Clone(applied.Sets), func(s *nftmodel.Set) bool { return slices.Contains(recreated, s.Name) })
	stayed.Chains = slices.DeleteFunc(slices.Clone(applied.Chains), func(c *nftmodel.Chain) bool { return slices.Contains(recreated, c.Name) })
	return kernelOrder(&stayed, desired)
}

// TestApplyAgainKeepsAffinity applies the same ruleset twice: the second
// Apply recreates nothing, lists the same, and leaves the elements the packet
// path put in the timeout sets (session affinity) where they are.
func TestApplyAgainKeepsAffinity(t *testing.T) {
	tests := []struct {
		rs     *nftmodel.Ruleset
		client string // put in the set "affinity" between the two Applies
	}{
		{fullRuleset(), "10.0.0.1"},
		{full6Ruleset(), "fd00::1"},
	}
	for _, tt := range tests {
		rs := tt.rs
		t.Run(rs.Family.String(), func(t *testing.T) {
			ns, conn := nftNS(t)
			first, err := Apply(conn, rs)
			if err != nil {
				t.Fatal(err)
			}
			listed := listTable(t, ns, rs)
			element := "{ " + tt.client + " }"
			nft(t, ns, "add", "element", rs.Family.String(), rs.Table, "affinity", element)

			second, err := Apply(conn, rs)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("first Apply: %+v", first)
			t.Logf("second Apply: %+v", second)
			// Nothing deleted or added: only the sets without a timeout
			// are flushed, and the rules of the whole table in one message.
			flushed := 0
			for _, s := range rs.Sets {
				if s.Timeout == 0 {
					flushed++
				}
			}
			if second.Chains != 0 || second.Sets != flushed || second.Elements != first.Elements || second.Rules != first.Rules {
				t.Errorf("second Apply %+v: want no chain touched, %d sets flushed, all elements and rules again", second, flushed)
			}
			if want := first.Messages - len(rs.Sets) - len(rs.Chains) + flushed + 1; second.Messages != want {
				t.Errorf("second Apply sent %d messages, want %d", second.Messages, want)
			}
			if got := setKeys(t, conn, rs, "affinity"); !slices.Equal(got, []netip.Addr{ip(tt.client)}) {
				t.Errorf("affinity set holds %v after the second Apply, want %s kept", got, tt.client)
			}
			nft(t, ns, "delete", "element", rs.Family.String(), rs.Table, "affinity", element)
			if d := gocmp.Diff(listed, listTable(t, ns, rs)); d != "" {
				t.Errorf("second Apply changed the listing (-first +second):\n%s", d)
			}
		})
	}
}

// TestApplyRepairsDrift changes the table behind the applier's back in every
// way nft allows, then applies the same ruleset again: the listing is
// Render's, except that the chains Apply had to recreate come last.
func TestApplyRepairsDrift(t *testing.T) {
	tests := []struct {
		name      string
		drift     func(t *testing.T, ns *netns.NS, conn *Conn, T string)
		recreated []string // chains and sets that move to the end
	}{
		{
			name: "objects",
			drift: func(t *testing.T, ns *netns.NS, conn *Conn, T string) {
				table := &nftables.Table{Name: T, Family: nftables.TableFamilyIPv4}
				rules, err := conn.lib.GetRules(table, &nftables.Chain{Table: table, Name: "masquerading"})
				if err != nil {
					t.Fatal(err)
				}
				nft(t, ns, "delete", "rule", "ip", T, "masquerading", "handle", fmt.Sprint(rules[1].Handle)) // a rule gone
				nft(t, ns, "add", "rule", "ip", T, "services", "counter")                                    // a rule too many
				nft(t, ns, "flush", "chain", "ip", T, "svc-dns")                                             // a chain emptied
				nft(t, ns, "flush", "map", "ip", T, "service-ips")                                           // a map emptied
				nft(t, ns, "add", "element", "ip", T, "nodeport-ips", "{ 192.0.2.1 }")                       // an element too many
				nft(t, ns, "delete", "element", "ip", T, "endpoints", "{ 10.96.0.10 . tcp . 80 }")           // one missing
				nft(t, ns, "delete", "chain", "ip", T, "empty")                                              // a chain gone
				nft(t, ns, "add", "chain", "ip", T, "filter-input", "{ policy drop; }")                      // a policy changed
				nft(t, ns, "add", "chain", "ip", T, "intruder")                                              // chains, sets and
				nft(t, ns, "add", "rule", "ip", T, "intruder", "ip saddr @nodeport-ips jump ep-dns")         // references too many
				nft(t, ns, "add", "set", "ip", T, "stray", "{ type ipv4_addr; elements = { 192.0.2.2 } }")
				nft(t, ns, "add", "element", "ip", T, "port-verdicts", "{ 23 : jump intruder }")
				nft(t, ns, "add", "rule", "ip", T, "services", "ip saddr vmap { 192.0.2.3 : jump intruder, 192.0.2.4 : drop }")
				nft(t, ns, "add", "rule", "ip", T, "svc-web", "ip saddr 192.0.2.5 jump { accept; }") // an anonymous chain
			},
			recreated: []string{"empty", "filter-input"},
		},
		{
			name: "table switched off",
			drift: func(t *testing.T, ns *netns.NS, _ *Conn, T string) {
				nft(t, ns, "add", "table", "ip", T, "{ flags dormant; }")
				nft(t, ns, "add", "chain", "ip", T, "intruder")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, conn := nftNS(t)
			rs := fullRuleset()
			if _, err := Apply(conn, rs); err != nil {
				t.Fatal(err)
			}
			tt.drift(t, ns, conn, rs.Table)
			if _, err := Apply(conn, rs); err != nil {
				t.Fatal(err)
			}
			want := nftmodel.Render(afterFullApply(rs, rs, tt.recreated...))
			if d := gocmp.Diff(want, listTable(t, ns, rs)); d != "" {
				t.Errorf("listing after repair (-want +got):\n%s", d)
			}
		})
	}
}

// TestApplyModelChange applies one ruleset, then another that removes,
// retypes and re-hooks objects: the listing is the second ruleset's.
func TestApplyModelChange(t *testing.T) {
	ns, conn := nftNS(t)
	from := fullRuleset()
	to := fullRuleset()
	to.Chains = slices.DeleteFunc(to.Chains, func(c *nftmodel.Chain) bool { return c.Name == "ep-web-3" || c.Name == "reject-chain" })
	to.Sets = slices.DeleteFunc(to.Sets, func(s *nftmodel.Set) bool { return s.Name == "empty-map" })
	to.Sets = append(to.Sets, &nftmodel.Set{Name: "new-set", Key: []nftmodel.DataType{nftmodel.TypeInetService}, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.N(8)}}}})
	for _, s := range to.Sets {
		switch s.Name {
		case "service-ips": // its jump to reject-chain goes
			s.Elements[2].Verdict = &nftmodel.Verdict{Kind: nftmodel.Drop}
		case "ports": // unused by rules: another type
			s.Key = []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}
			s.Elements = []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(ip("10.1.1.1")), nftmodel.N(80)}}}
		case "affinity-ports": // another timeout
			s.Timeout = time.Hour
		}
	}
	for _, c := range to.Chains {
		switch c.Name {
		case "nat-postrouting":
			c.Base.Priority = 110
		case "filter-output":
			c.Rules = []nftmodel.Rule{nlRule(nftmodel.Verdict{Kind: nftmodel.Accept})}
		case "svc-web":
			c.Rules[1] = nlRule(nftmodel.NumgenGoto{Chains: []string{"ep-web-1", "ep-web-2"}})
		}
	}
	to.Chains = append(to.Chains, &nftmodel.Chain{Name: "new-chain", Rules: []nftmodel.Rule{nlRule(nftmodel.Verdict{Kind: nftmodel.Return})}})

	if _, err := Apply(conn, from); err != nil {
		t.Fatal(err)
	}
	nft(t, ns, "add", "element", "ip", from.Table, "affinity", "{ 10.0.0.1 }")
	nft(t, ns, "add", "element", "ip", from.Table, "affinity-ports", "{ 10.0.0.2 . 80 }")
	if _, err := Apply(conn, to); err != nil {
		t.Fatal(err)
	}
	// The affinity set kept its element, the retyped one lost its own.
	if got := setKeys(t, conn, to, "affinity-ports"); len(got) != 0 {
		t.Errorf("affinity-ports holds %v after its timeout changed, want nothing", got)
	}
	nft(t, ns, "delete", "element", "ip", from.Table, "affinity", "{ 10.0.0.1 }")
	want := nftmodel.Render(afterFullApply(from, to, "ports", "affinity-ports", "nat-postrouting"))
	if d := gocmp.Diff(want, listTable(t, ns, to)); d != "" {
		t.Errorf("listing after the model changed (-want +got):\n%s", d)
	}
}

// TestStaleGenerationRefused checks what Apply's retry relies on: the kernel
// refuses a batch carrying a generation older than the ruleset's with
// ERESTART, and applies none of it.
func TestStaleGenerationRefused(t *testing.T) {
	ns, conn := nftNS(t)
	gen, err := conn.lib.GetGen()
	if err != nil {
		t.Fatal(err)
	}
	nft(t, ns, "add", "table", "ip", "someone-else")
	b := newBatch(conn, nftmodel.IPv4, "mine")
	b.addTable()
	if _, err := b.send("apply", gen.ID); !errors.Is(err, unix.ERESTART) {
		t.Fatalf("batch with a stale generation: got %v, want ERESTART", err)
	}
	tables, err := conn.lib.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == "mine" {
			t.Error("the refused batch created its table")
		}
	}
}

// TestTypeofUserDataMatchesNft checks the user data written for typeof sets
// byte for byte against what nft itself stores for the same declarations:
// the sets of both fixtures that have a typeof are created with `nft -f`,
// and their user data is read back raw from the kernel.
func TestTypeofUserDataMatchesNft(t *testing.T) {
	for _, full := range []*nftmodel.Ruleset{fullRuleset(), full6Ruleset()} {
		rs := &nftmodel.Ruleset{Family: full.Family, Table: full.Table}
		for _, s := range full.Sets {
			if s.Typeof != nil {
				rs.Sets = append(rs.Sets, s)
			}
		}
		t.Run(rs.Family.String(), func(t *testing.T) {
			ns, _ := nftNS(t)
			loadText(t, ns, nftmodel.Render(rs))
			stored := rawSetUserData(t, ns, rs.Family, rs.Table)
			for _, s := range rs.Sets {
				want, err := typeofUserData(rs.Family, s)
				if err != nil {
					t.Fatal(err)
				}
				if d := gocmp.Diff(stored[s.Name], want); d != "" {
					t.Errorf("set %s: user data differs (-nft +ours):\n%s", s.Name, d)
				}
			}
		})
	}
}

// rawSetUserData returns each set's NFTA_SET_USERDATA as the kernel stores
// it (setUserData, which Read uses).
func rawSetUserData(t *testing.T, ns *netns.NS, f nftmodel.Family, table string) map[string][]byte {
	t.Helper()
	conn, err := Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	out, err := setUserData(conn, f, table)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReadRefusesWhatTheModelLacks: a set type, a set kind or an expression
// nftproxy doesn't write fails Read with an error naming it, rather than
// printing text that differs from nft's.
func TestReadRefusesWhatTheModelLacks(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"set type", "table ip t {\n set s {\n type mark\n }\n}", "read set s: read key type: unsupported type"},
		{"typeof with a field the model lacks", "table ip t {\n set s {\n typeof ip daddr . ip protocol\n }\n}", "read set s: typeof key: part 1: expression type 7"},
		{"typeof of one expression", "table ip t {\n set s {\n typeof ip daddr\n }\n}", "read set s: typeof key: not a concatenation"},
		{"interval set", "table ip t {\n set s {\n type ipv4_addr\n flags interval\n }\n}", "read set s: declared with flags"},
		{"expression", "table ip t {\n chain c {\n limit rate 10/second\n }\n}", "read chain c: read rule 1: expression 1 (Limit): no model expression writes this"},
		{"base chain policy", "table ip t {\n chain c {\n type filter hook input priority 0; policy drop;\n }\n}", "read chain c: a base chain nftproxy doesn't write"},
	}
	ns, conn := nftNS(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			loadText(t, ns, tt.text)
			defer func() { _ = Delete(conn, nftmodel.IPv4, "t") }()
			_, err := Read(conn, nftmodel.IPv4, "t")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Read: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := Read(conn, nftmodel.IPv4, "missing"); !errors.Is(err, ErrNoTable) {
		t.Errorf("Read of a missing table: %v, want ErrNoTable", err)
	}
}

// TestApplyIntervalChanges changes an interval set's elements in place: a
// range removed, one whose start stays but whose end moves, one added. A
// deletion must name the element's end too, or the kernel finds nothing.
// nft lists such a set in the order its elements came, so the check is
// Read's, which sorts as Render does.
func TestApplyIntervalChanges(t *testing.T) {
	from := fullRuleset()
	to := fullRuleset()
	var allow *nftmodel.Set
	for _, s := range to.Sets {
		if s.Name == "firewall-allow" {
			allow = s
		}
	}
	lb := ip("10.96.0.1")
	allow.Elements = []nftmodel.Element{
		{Key: fwKey(lb, "192.168.0.0"), KeyEnd: fwKey(lb, "192.168.127.255"), Comment: "default/web:http"},
		{Key: fwKey(lb, "10.96.0.1")},
		{Key: fwKey(lb, "0.0.0.0"), KeyEnd: fwKey(lb, "0.255.255.255")},
		{Key: fwKey(ip("10.96.0.2"), "172.16.0.0"), KeyEnd: fwKey(ip("10.96.0.2"), "172.31.255.255")},
	}
	changes, ok := nftmodel.Diff(from, to)
	if !ok {
		t.Fatal("Diff: not incremental")
	}
	if len(changes.DelElements) != 1 || len(changes.DelElements[0].Elements) != 2 || len(changes.AddElements) != 1 || len(changes.AddElements[0].Elements) != 2 {
		t.Fatalf("changes: %+v, want 2 elements deleted and 2 added", changes)
	}
	ns, conn := nftNS(t)
	if _, err := Apply(conn, from); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyChanges(conn, to.Family, to.Table, &changes); err != nil {
		t.Fatal(err)
	}
	read, err := Read(conn, to.Family, to.Table)
	if err != nil {
		t.Fatal(err)
	}
	if d := gocmp.Diff(nftmodel.Render(to), nftmodel.Render(read)); d != "" {
		t.Errorf("read back after ApplyChanges (-want +got):\n%s", d)
	}
	listed := listTable(t, ns, to)
	for _, e := range []string{"10.96.0.1 . tcp . 80 . 192.168.0.0/17", "10.96.0.2 . tcp . 80 . 172.16.0.0/12"} {
		if !strings.Contains(listed, e) {
			t.Errorf("nft lists no %s:\n%s", e, listed)
		}
	}
	if strings.Contains(listed, "1.2.3.4-1.2.3.9") {
		t.Errorf("nft still lists the deleted range:\n%s", listed)
	}
}
