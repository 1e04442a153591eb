package features

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// probeNotifications listens to nftables notifications while a probe table
// comes and goes, and looks for the table's creation among them. The
// kernel sends a commit's notifications before it answers the batch, so
// they are waiting once the probe returns.
func probeNotifications(p *Prober) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: p.netns})
	if err != nil {
		return fmt.Errorf("dial nftables netlink: %w", err)
	}
	defer func() { _ = conn.Close() }()
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("join nftables notification group: %w", err)
	}
	name := p.tableName()
	if err := p.programTable(name, func(*build) error { return nil }, false); err != nil {
		return err
	}
	if err := conn.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		return fmt.Errorf("set notification read deadline: %w", err)
	}
	newTable := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE)
	for {
		msgs, err := conn.Receive()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EWOULDBLOCK) || isTimeout(err) {
			return fmt.Errorf("no notification of table %s: %w", name, errMissing)
		}
		if errors.Is(err, unix.ENOBUFS) {
			// Other programs' notifications overflowed the socket while the
			// probe ran: the group delivers.
			return nil
		}
		if err != nil {
			return fmt.Errorf("receive nftables notifications: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != newTable || len(m.Data) < 4 {
				continue
			}
			if got, ok := stringAttr(m.Data[4:], unix.NFTA_TABLE_NAME); ok && got == name {
				return nil
			}
		}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// probeConntrack asks conntrack netlink to delete a flow no one has (between
// two documentation addresses): a kernel that can delete flows answers that
// there is no such flow.
func probeConntrack(p *Prober) error {
	c, err := ct.Dial(&netlink.Config{NetNS: p.netns})
	if err != nil {
		return fmt.Errorf("dial conntrack netlink: %w", err)
	}
	defer func() { _ = c.Close() }()
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	var f ct.Flow
	f.TupleOrig.IP.SourceAddress, f.TupleOrig.IP.DestinationAddress = a, b
	f.TupleOrig.Proto.Protocol, f.TupleOrig.Proto.SourcePort, f.TupleOrig.Proto.DestinationPort = unix.IPPROTO_UDP, 9, 9
	f.TupleReply.IP.SourceAddress, f.TupleReply.IP.DestinationAddress = b, a
	f.TupleReply.Proto = f.TupleOrig.Proto
	err = c.Delete(f)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("delete conntrack flow: %w", err)
}
