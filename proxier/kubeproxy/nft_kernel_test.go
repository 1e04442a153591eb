package kubeproxy

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// describeMsg names a batch message: its type, family, table, chain and
// rule handle; the generation of a batch begin.
func describeMsg(t *testing.T, m netlink.Message) string {
	t.Helper()
	switch m.Header.Type {
	case netlink.HeaderType(unix.NFNL_MSG_BATCH_END):
		return "END"
	case netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN):
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range attrs {
			if a.Type == unix.NFNL_BATCH_GENID {
				return fmt.Sprintf("BEGIN genid %d", binary.BigEndian.Uint32(a.Data))
			}
		}
		return "BEGIN"
	}
	typ := map[int]string{unix.NFT_MSG_DELRULE: "DELRULE", unix.NFT_MSG_DELCHAIN: "DELCHAIN"}[int(m.Header.Type&0xff)]
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

// TestApplyNFTBatch records the batch a plan becomes: one batch carrying
// the listing's generation, the jumps deleted first, then every chain
// flushed, then deleted.
func TestApplyNFTBatch(t *testing.T) {
	var got []string
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		for _, m := range req {
			got = append(got, describeMsg(t, m))
		}
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	p := NFTPlan{
		Rules: []NFTRule{{nftmodel.IPv4, "nat", "PREROUTING", 3}, {nftmodel.IPv6, "filter", "INPUT", 9}},
		Chains: []NFTChain{
			{Family: nftmodel.IPv4, Table: "nat", Name: "KUBE-SERVICES"},
			{Family: nftmodel.IPv4, Table: "nat", Name: "KUBE-SVC-X"},
			{Family: nftmodel.IPv6, Table: "filter", Name: "KUBE-FORWARD"},
		},
	}
	if err := applyNFT(conn, p, 42); err != nil {
		t.Fatal(err)
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
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
}
