package nftnl

import (
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

func TestParseEvent(t *testing.T) {
	named := func(typ int, family uint8, table string, port uint32) netlink.Message {
		m := nftMsg(t, typ, family, 0, []netlink.Attribute{{Type: 1, Data: append([]byte(table), 0)}, {Type: 2, Data: []byte("x\x00")}})
		m.Header.PID = port
		return m
	}
	gen := nftMsg(t, unix.NFT_MSG_NEWGEN, 0, 0, []netlink.Attribute{{Type: 1, Data: be32(7)}, {Type: 2, Data: be32(1234)}})
	gen.Header.PID = 9
	for _, tt := range []struct {
		name string
		msg  netlink.Message
		want nftmodel.Event
		ok   bool
	}{
		{"element deleted", named(unix.NFT_MSG_DELSETELEM, unix.NFPROTO_IPV4, "nftproxy", 9),
			nftmodel.Event{Type: unix.NFT_MSG_DELSETELEM, Family: unix.NFPROTO_IPV4, Table: "nftproxy", Port: 9}, true},
		{"table deleted", named(unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV6, "nftproxy", 0),
			nftmodel.Event{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV6, Table: "nftproxy"}, true},
		{"generation", gen, nftmodel.Event{Type: unix.NFT_MSG_NEWGEN, Port: 9}, true},
		{"no table", nftMsg(t, unix.NFT_MSG_NEWCHAIN, unix.NFPROTO_IPV4, 0, []netlink.Attribute{{Type: 3, Data: []byte("c\x00")}}), nftmodel.Event{}, false},
		{"another subsystem", netlink.Message{Header: netlink.Header{Type: unix.NFNL_SUBSYS_CTNETLINK << 8}, Data: []byte{2, 0, 0, 0}}, nftmodel.Event{}, false},
		{"short", netlink.Message{Header: netlink.Header{Type: unix.NFNL_SUBSYS_NFTABLES << 8}, Data: []byte{2}}, nftmodel.Event{}, false},
	} {
		got, ok := ParseEvent(tt.msg)
		if ok != tt.ok || got != tt.want {
			t.Errorf("%s: ParseEvent = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// The model spells the kernel's numbers it shares with the proxier out, so as
// not to import the kernel's headers; they must be the kernel's.
func TestModelKernelNumbers(t *testing.T) {
	if nftmodel.EventNewGen != unix.NFT_MSG_NEWGEN {
		t.Errorf("nftmodel.EventNewGen = %d, the kernel's NFT_MSG_NEWGEN is %d", nftmodel.EventNewGen, unix.NFT_MSG_NEWGEN)
	}
	for nfproto, want := range map[uint8]nftmodel.Family{unix.NFPROTO_IPV4: nftmodel.IPv4, unix.NFPROTO_IPV6: nftmodel.IPv6} {
		if f, ok := nftmodel.FamilyOf(nfproto); !ok || f != want {
			t.Errorf("FamilyOf(%d) = %v, %v; want %v", nfproto, f, ok, want)
		}
	}
	if _, ok := nftmodel.FamilyOf(unix.NFPROTO_INET); ok {
		t.Error("FamilyOf(NFPROTO_INET) is a family of the model")
	}
}
