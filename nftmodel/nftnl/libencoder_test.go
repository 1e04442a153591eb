package nftnl

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// libGolden holds what the pinned google/nftables encodes for every kind of
// message nftproxy has it encode.
const libGolden = "testdata/libencoder.golden"

// TestLibEncoderGolden plans a full Apply of the fixtures of both families
// into an empty table, and the deletions and flushes Apply and ApplyChanges
// plan, and compares the library's encoding of each message with what the
// pinned version encoded when the kernel tests last passed. A difference
// means google/nftables changed its encoding: run the kernel tests (as root,
// `go test ./nftmodel/nftnl/`), which compare what nft lists with Render,
// and when they pass rewrite the golden file with -update.
func TestLibEncoderGolden(t *testing.T) {
	var out strings.Builder
	for _, rs := range []*nftmodel.Ruleset{fullRuleset(), full6Ruleset()} {
		b := newBatch(nil, rs.Family, rs.Table)
		for _, s := range rs.Sets {
			if _, err := b.declare(s); err != nil {
				t.Fatal(err)
			}
		}
		b.reconcile(&tableState{}, rs)
		for _, c := range rs.Chains {
			if err := b.addRules(c); err != nil {
				t.Fatal(err)
			}
		}
		b.flushTable()
		b.flushSet(rs.Sets[0].Name)
		b.delSet(rs.Sets[0].Name)
		b.flushChain(rs.Chains[0].Name)
		b.delChain(rs.Chains[0].Name)
		b.delTable()

		var what []string
		for _, s := range b.steps {
			if s.queue == nil {
				continue
			}
			if err := s.queue(); err != nil {
				t.Fatalf("%s: %v", s.what, err)
			}
			for range s.msgs {
				what = append(what, s.what)
			}
		}
		msgs, err := b.lib.encode()
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != len(what) {
			t.Fatalf("%s: the library made %d messages, %d planned: google/nftables changed how many messages a call makes", rs.Family, len(msgs), len(what))
		}
		for i, m := range msgs {
			fmt.Fprintf(&out, "%s: %s\n\ttype %#04x flags %#04x\n\t%x\n", rs.Family, what[i], uint16(m.Header.Type), uint16(m.Header.Flags), m.Data)
		}
	}
	if *update {
		if err := os.WriteFile(libGolden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(libGolden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), out.String()); diff != "" {
		t.Errorf("google/nftables encodes differently from the version this was checked with; "+
			"run the kernel tests, then go test ./nftmodel/nftnl/ -run TestLibEncoderGolden -update (-%s +now):\n%s", libGolden, diff)
	}
}

// The encoder refuses a batch framed otherwise than the copy into our own
// buffer expects.
func TestCheckLibBatch(t *testing.T) {
	msg := func(typ uint16, data int) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ)}, Data: make([]byte, data)}
	}
	begin, end := msg(unix.NFNL_MSG_BATCH_BEGIN, 4), msg(unix.NFNL_MSG_BATCH_END, 4)
	table := msg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE, 12)
	for _, tt := range []struct {
		name string
		req  []netlink.Message
		ok   bool
	}{
		{"batch", []netlink.Message{begin, table, end}, true},
		{"empty batch", []netlink.Message{begin, end}, true},
		{"no begin", []netlink.Message{table, end}, false},
		{"no end", []netlink.Message{begin, table}, false},
		{"one message", []netlink.Message{table}, false},
		{"another subsystem", []netlink.Message{begin, msg(unix.NFNL_SUBSYS_CTNETLINK<<8, 12), end}, false},
		{"no nfgenmsg", []netlink.Message{begin, msg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE, 2), end}, false},
	} {
		if err := checkLibBatch(tt.req); (err == nil) != tt.ok {
			t.Errorf("%s: checkLibBatch = %v", tt.name, err)
		}
	}
}
