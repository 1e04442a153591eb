package nftmodel

import (
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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
		want Event
		ok   bool
	}{
		{"element deleted", named(unix.NFT_MSG_DELSETELEM, unix.NFPROTO_IPV4, "nftproxy", 9),
			Event{Type: unix.NFT_MSG_DELSETELEM, Family: unix.NFPROTO_IPV4, Table: "nftproxy", Port: 9}, true},
		{"table deleted", named(unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV6, "nftproxy", 0),
			Event{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV6, Table: "nftproxy"}, true},
		{"generation", gen, Event{Type: unix.NFT_MSG_NEWGEN, Port: 9}, true},
		{"no table", nftMsg(t, unix.NFT_MSG_NEWCHAIN, unix.NFPROTO_IPV4, 0, []netlink.Attribute{{Type: 3, Data: []byte("c\x00")}}), Event{}, false},
		{"another subsystem", netlink.Message{Header: netlink.Header{Type: unix.NFNL_SUBSYS_CTNETLINK << 8}, Data: []byte{2, 0, 0, 0}}, Event{}, false},
		{"short", netlink.Message{Header: netlink.Header{Type: unix.NFNL_SUBSYS_NFTABLES << 8}, Data: []byte{2}}, Event{}, false},
	} {
		got, ok := ParseEvent(tt.msg)
		if ok != tt.ok || got != tt.want {
			t.Errorf("%s: ParseEvent = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
