package nftnl

import (
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Create sends, without reading the kernel, the messages Apply sends into a
// table that doesn't exist, the table owned when asked; Drop deletes the
// table and nothing else.
func TestCreateAndDrop(t *testing.T) {
	rs := fullRuleset()
	r, applyConn := newRecorder(t)
	if _, err := Apply(applyConn, rs); err != nil {
		t.Fatal(err)
	}
	want := msgTypes(r.lastBatch())

	var batches [][]netlink.Message
	conn := dialConn(t, func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) > 0 && req[0].Header.Type != netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN) {
			t.Errorf("Create or Drop asked the kernel %s", msgType(req[0]))
		}
		if len(req) > 0 {
			batches = append(batches, slices.Clone(req))
		}
		return nil, nil
	})
	for _, owned := range []bool{false, true} {
		batches = nil
		if err := Create(conn, rs, owned); err != nil {
			t.Fatal(err)
		}
		if len(batches) != 1 {
			t.Fatalf("Create sent %d batches, want 1", len(batches))
		}
		if got := msgTypes(batches[0]); !slices.Equal(got, want) {
			t.Errorf("Create sent %v, want Apply's %v", got, want)
		}
		if got := u32Attr(t, batches[0][1], unix.NFTA_TABLE_FLAGS); (got&uint32(nftables.TableFlagOwner) != 0) != owned {
			t.Errorf("owned %v: table flags %#x", owned, got)
		}
	}
	batches = nil
	if err := Drop(conn, rs.Family, rs.Table); err != nil {
		t.Fatal(err)
	}
	if len(batches) != 1 || !slices.Equal(msgTypes(batches[0]), []string{"BEGIN", "DELTABLE", "END"}) {
		t.Errorf("Drop sent %v, want one batch deleting the table", batches)
	}
}
