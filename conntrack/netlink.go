package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
)

// Conn is the conntrack table of one network namespace, over netlink.
type Conn struct {
	c *ct.Conn
}

var _ Table = (*Conn)(nil)

// Dial opens a conntrack netlink connection in the network namespace whose
// file descriptor is netns; 0 means the caller's namespace. The descriptor
// may be closed once Dial returns.
func Dial(netns int) (*Conn, error) {
	c, err := ct.Dial(&netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("dial conntrack netlink: %w", err)
	}
	return &Conn{c: c}, nil
}

// Close closes the netlink connection.
func (c *Conn) Close() error {
	if err := c.c.Close(); err != nil {
		return fmt.Errorf("close conntrack netlink: %w", err)
	}
	return nil
}

// Dump returns every flow of both address families. The kernel can't filter
// a dump on protocol or tuples, so this reads the whole table. ctx is only
// checked before the dump starts: a netlink dump can't be interrupted.
func (c *Conn) Dump(ctx context.Context) ([]Flow, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dump conntrack table: %w", err)
	}
	raw, err := c.c.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("dump conntrack table: %w", err)
	}
	flows := make([]Flow, 0, len(raw))
	for i := range raw {
		r := &raw[i]
		o, p := r.TupleOrig, r.TupleReply
		flows = append(flows, Flow{
			Proto:    o.Proto.Protocol,
			OrigSrc:  netip.AddrPortFrom(norm(o.IP.SourceAddress), o.Proto.SourcePort),
			OrigDst:  netip.AddrPortFrom(norm(o.IP.DestinationAddress), o.Proto.DestinationPort),
			ReplySrc: netip.AddrPortFrom(norm(p.IP.SourceAddress), p.Proto.SourcePort),
			ReplyDst: netip.AddrPortFrom(norm(p.IP.DestinationAddress), p.Proto.DestinationPort),
			Zone:     r.Zone,
		})
	}
	return flows, nil
}

// Delete removes f, found by its original tuple and zone. It returns an error
// matching ErrNotExist when the flow is already gone. A flow that expired and
// was recreated with the same original tuple since the dump is deleted too;
// for UDP that costs one new DNAT decision under the current rules.
func (c *Conn) Delete(ctx context.Context, f Flow) error {
	var d ct.Flow
	d.TupleOrig = tuple(f.Proto, f.OrigSrc, f.OrigDst)
	d.TupleReply = tuple(f.Proto, f.ReplySrc, f.ReplyDst)
	d.Zone = f.Zone
	if err := c.c.Delete(d); err != nil {
		return fmt.Errorf("delete flow %s: %w", f, err)
	}
	return nil
}

func tuple(proto uint8, src, dst netip.AddrPort) ct.Tuple {
	var t ct.Tuple
	t.IP.SourceAddress = src.Addr()
	t.IP.DestinationAddress = dst.Addr()
	t.Proto.Protocol = proto
	t.Proto.SourcePort = src.Port()
	t.Proto.DestinationPort = dst.Port()
	return t
}

// InterfaceAddrs lists the addresses of the calling network namespace's
// interfaces: where NodePorts answer.
func InterfaceAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifAddrs))
	for _, a := range ifAddrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
