package features

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// probeNotifications subscribes to nftables notifications, makes a probe
// table come and go, and looks for the table's creation among them. The
// kernel sends a commit's notifications before it answers the batch, so
// they are waiting once the probe returns.
func probeNotifications(p *Prober) error {
	w, err := nftnl.NewWatcher(p.netns)
	if err != nil {
		return err
	}
	name := p.tableName()
	progErr := p.programTable(name, func(*build) {}, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if progErr != nil {
		cancel() // Run only closes the subscription
	}
	seen := false
	err = w.Run(ctx, func(events []nftmodel.Event) {
		for _, e := range events {
			// Lost: other programs' notifications overflowed the socket
			// while the probe ran; the group delivers.
			if e.Lost || e.Type == unix.NFT_MSG_NEWTABLE && e.Table == name {
				seen = true
				cancel()
			}
		}
	})
	switch {
	case progErr != nil:
		return progErr
	case seen:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no notification of table %s: %w", name, errMissing)
	}
	return err
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
