package nftmodel

import (
	"context"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Event is one nftables notification: an object a commit in the namespace
// added or deleted, or the commit's new generation.
type Event struct {
	Type   uint16 // NFT_MSG_NEWTABLE … (unix.NFT_MSG_*), NFT_MSG_NEWGEN ends a commit
	Family uint8  // the table's netfilter family (unix.NFPROTO_*)
	Table  string // the table the object is in; empty for a generation
	Port   uint32 // netlink port ID of the socket whose batch committed it
	// Lost: the kernel dropped notifications, as the socket's buffer
	// overflowed; which and whose is unknown.
	Lost bool
}

// monitorBuffer is the notification socket's receive buffer: a full sync
// of 10,000 services notifies some 60,000 elements.
const monitorBuffer = 16 << 20

// Watch subscribes to the nftables notifications of the network namespace
// netnsFd (0 for the caller's own) and calls fn with the events of each
// read, in order, until ctx ends. It returns ctx's error, or why the
// subscription failed.
func Watch(ctx context.Context, netnsFd int, fn func([]Event)) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFd})
	if err != nil {
		return fmt.Errorf("dial netfilter socket: %w", err)
	}
	defer func() { _ = c.Close() }()
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("join nftables group: %w", err)
	}
	// Root may force a buffer above the system's limit; else take what's allowed.
	if err := setForcedReadBuffer(c, monitorBuffer); err != nil {
		_ = c.SetReadBuffer(monitorBuffer)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	for {
		msgs, err := c.Receive()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, unix.ENOBUFS):
			fn([]Event{{Lost: true}})
			continue
		case err != nil:
			return fmt.Errorf("receive nftables notifications: %w", err)
		}
		events := make([]Event, 0, len(msgs))
		for _, m := range msgs {
			if e, ok := ParseEvent(m); ok {
				events = append(events, e)
			}
		}
		if len(events) > 0 {
			fn(events)
		}
	}
}

func setForcedReadBuffer(c *netlink.Conn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
	}); err != nil {
		return err
	}
	return serr
}

// ParseEvent decodes an nftables notification; false when m is none (or is
// malformed).
func ParseEvent(m netlink.Message) (Event, bool) {
	typ := uint16(m.Header.Type)
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return Event{}, false
	}
	e := Event{Type: typ & 0xff, Family: m.Data[0], Port: m.Header.PID}
	if e.Type == unix.NFT_MSG_NEWGEN {
		return e, true
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return Event{}, false
	}
	// Attribute 1 names the table in the messages of every object kind:
	// NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
	// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, NFTA_FLOWTABLE_TABLE.
	for ad.Next() {
		if ad.Type() == 1 {
			e.Table = ad.String()
			break
		}
	}
	if ad.Err() != nil || e.Table == "" {
		return Event{}, false
	}
	return e, true
}

// FamilyOf returns the model's family of a netfilter family number.
func FamilyOf(nfproto uint8) (Family, bool) {
	switch nfproto {
	case unix.NFPROTO_IPV4:
		return IPv4, true
	case unix.NFPROTO_IPV6:
		return IPv6, true
	}
	return 0, false
}

// EventNewGen is the Type of the event ending each commit.
const EventNewGen = unix.NFT_MSG_NEWGEN
