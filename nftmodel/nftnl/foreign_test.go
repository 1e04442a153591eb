package nftnl

import (
	"encoding/binary"
	"fmt"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// describeRef names a message of DeleteRulesAndChains's batch by family,
// table, chain and rule handle; the generation of the batch begin.
func describeRef(t *testing.T, m netlink.Message) string {
	t.Helper()
	typ := msgType(m)
	switch typ {
	case "BEGIN":
		return fmt.Sprintf("BEGIN genid %d", batchGenID(t, m))
	case "END":
		return typ
	}
	attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	out := fmt.Sprintf("%s family %d", typ, m.Data[0])
	chainAttr := uint16(unix.NFTA_RULE_CHAIN)
	if typ == "DELCHAIN" {
		chainAttr = unix.NFTA_CHAIN_NAME
	}
	for _, a := range attrs {
		switch {
		case a.Type == unix.NFTA_RULE_TABLE, a.Type == chainAttr: // NFTA_RULE_TABLE = NFTA_CHAIN_TABLE
			out += " " + string(a.Data[:len(a.Data)-1])
		case typ == "DELRULE" && a.Type == unix.NFTA_RULE_HANDLE:
			out += fmt.Sprintf(" handle %d", binary.BigEndian.Uint64(a.Data))
		}
	}
	return out
}

// TestDeleteRulesAndChainsBatch records the batch: one batch carrying the
// generation, the rules deleted first, then every chain flushed, then
// deleted, across tables and families.
func TestDeleteRulesAndChainsBatch(t *testing.T) {
	r, conn := newRecorder(t)
	rules := []RuleRef{{nftmodel.IPv4, "nat", "PREROUTING", 3}, {nftmodel.IPv6, "filter", "INPUT", 9}}
	chains := []ChainRef{
		{nftmodel.IPv4, "nat", "KUBE-SERVICES"},
		{nftmodel.IPv4, "nat", "KUBE-SVC-X"},
		{nftmodel.IPv6, "filter", "KUBE-FORWARD"},
	}
	if err := conn.DeleteRulesAndChains(42, rules, chains); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range r.lastBatch() {
		got = append(got, describeRef(t, m))
	}
	want := []string{
		"BEGIN genid 42",
		"DELRULE family 2 nat PREROUTING handle 3",
		"DELRULE family 10 filter INPUT handle 9",
		"DELRULE family 2 nat KUBE-SERVICES",
		"DELRULE family 2 nat KUBE-SVC-X",
		"DELRULE family 10 filter KUBE-FORWARD",
		"DELCHAIN family 2 nat KUBE-SERVICES",
		"DELCHAIN family 2 nat KUBE-SVC-X",
		"DELCHAIN family 10 filter KUBE-FORWARD",
		"END",
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
	if len(r.batches) != 1 {
		t.Errorf("%d batches, want 1", len(r.batches))
	}
}

// TestForeignChainsInKernel lists another program's chains and their jumps
// in a fresh namespace and deletes the jumps and the chains they go to in
// one batch: the rest of the table stays as it was.
func TestForeignChainsInKernel(t *testing.T) {
	ns, conn := nftNS(t)
	loadText(t, ns, `table ip other {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 jump ssh
		counter
		goto tail
	}
	chain ssh {
		jump tail
	}
	chain tail {
		accept
	}
}
`)
	gen, err := Generation(conn)
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.Chains(nftmodel.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff([]TableChain{{"other", "input"}, {"other", "ssh"}, {"other", "tail"}}, chains); diff != "" {
		t.Errorf("Chains (-want +got):\n%s", diff)
	}
	jumps, err := conn.Jumps(nftmodel.IPv4, "other", "input")
	if err != nil {
		t.Fatal(err)
	}
	if len(jumps) != 2 || jumps[0].Target != "ssh" || jumps[1].Target != "tail" || jumps[0].Handle == 0 || jumps[0].Handle == jumps[1].Handle {
		t.Fatalf("Jumps = %+v, want the rules going to ssh and tail", jumps)
	}
	var rules []RuleRef
	for _, j := range jumps {
		rules = append(rules, RuleRef{nftmodel.IPv4, "other", "input", j.Handle})
	}
	err = conn.DeleteRulesAndChains(gen, rules, []ChainRef{{nftmodel.IPv4, "other", "ssh"}, {nftmodel.IPv4, "other", "tail"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ns.Exec("nft", "list", "table", "ip", "other")
	if err != nil {
		t.Fatal(err)
	}
	want := `table ip other {
	chain input {
		type filter hook input priority filter; policy accept;
		counter packets 0 bytes 0
	}
}
`
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("after the deletion (-want +got):\n%s", diff)
	}
}
