package nftnl

import (
	"context"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// monitorBuffer is the notification socket's receive buffer: a full sync
// of 10,000 services notifies some 60,000 elements.
const monitorBuffer = 16 << 20

// Watcher is a subscription to the nftables notifications of a network
// namespace.
type Watcher struct{ c *netlink.Conn }

// NewWatcher subscribes to the nftables notifications of the network
// namespace netnsFd (0 for the caller's own); Run reads them.
func NewWatcher(netnsFd int) (*Watcher, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFd})
	if err != nil {
		return nil, fmt.Errorf("dial netfilter socket: %w", err)
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("join nftables group: %w", err)
	}
	// Root may force a buffer above the system's limit; else take what's allowed.
	if err := setForcedReadBuffer(c, monitorBuffer); err != nil {
		_ = c.SetReadBuffer(monitorBuffer)
	}
	return &Watcher{c: c}, nil
}

// Pause leaves the notification group and Resume joins it again. While no
// socket listens the kernel writes no notifications, which costs a commit
// of many elements several times its time (BenchmarkApplyWatched): a sync
// pauses the watcher and tells foreign commits during it by the ruleset
// generation instead.
func (w *Watcher) Pause() error { return w.c.LeaveGroup(unix.NFNLGRP_NFTABLES) }

// Resume: see Pause.
func (w *Watcher) Resume() error { return w.c.JoinGroup(unix.NFNLGRP_NFTABLES) }

// Run calls fn with the events of each read, in order, until ctx ends,
// and closes the subscription. It returns ctx's error, or why reading
// failed.
func (w *Watcher) Run(ctx context.Context, fn func([]nftmodel.Event)) error {
	c := w.c
	defer func() { _ = c.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	for {
		msgs, err := c.Receive()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, unix.ENOBUFS):
			fn([]nftmodel.Event{{Lost: true}})
			continue
		case err != nil:
			return fmt.Errorf("receive nftables notifications: %w", err)
		}
		events := make([]nftmodel.Event, 0, len(msgs))
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

// Watch is NewWatcher and Run.
func Watch(ctx context.Context, netnsFd int, fn func([]nftmodel.Event)) error {
	w, err := NewWatcher(netnsFd)
	if err != nil {
		return err
	}
	return w.Run(ctx, fn)
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
func ParseEvent(m netlink.Message) (nftmodel.Event, bool) {
	typ := uint16(m.Header.Type)
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return nftmodel.Event{}, false
	}
	e := nftmodel.Event{Type: typ & 0xff, Family: m.Data[0], Port: m.Header.PID}
	if e.Type == unix.NFT_MSG_NEWGEN {
		return e, true
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return nftmodel.Event{}, false
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
		return nftmodel.Event{}, false
	}
	return e, true
}
