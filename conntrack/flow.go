package conntrack

import (
	"fmt"
	"net/netip"
)

// IP protocol numbers of the flows the reconciler looks at.
const (
	protoTCP  uint8 = 6
	protoUDP  uint8 = 17
	protoSCTP uint8 = 132
)

// Flow is one conntrack entry, reduced to what the reconciler decides on and
// what the kernel needs to find the entry again.
type Flow struct {
	Proto uint8 // IP protocol number

	// OrigSrc and OrigDst are the original direction as the client sent it:
	// OrigDst is the service address before DNAT.
	OrigSrc, OrigDst netip.AddrPort

	// ReplySrc and ReplyDst are the reply direction as the kernel expects it:
	// ReplySrc is the endpoint the flow was DNATed to (equal to OrigDst when
	// no DNAT happened), ReplyDst differs from OrigSrc when the flow was
	// masqueraded.
	ReplySrc, ReplyDst netip.AddrPort

	// Zone is the conntrack zone; deleting needs it to find the entry.
	Zone uint16
}

// DNAT reports whether the flow's destination was rewritten.
func (f Flow) DNAT() bool { return f.ReplySrc != f.OrigDst }

// String prints the flow like "udp 10.0.0.1:5353 -> 10.96.0.10:53 => 10.244.1.5:53".
func (f Flow) String() string {
	s := fmt.Sprintf("%s %s -> %s", protoName(f.Proto), f.OrigSrc, f.OrigDst)
	if f.DNAT() {
		s += " => " + f.ReplySrc.String()
	}
	if f.Zone != 0 {
		s += fmt.Sprintf(" zone %d", f.Zone)
	}
	return s
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", p)
}

// norm makes addresses comparable across sources: conntrack reports IPv4 as
// 4 bytes but a snapshot may hold IPv4-mapped IPv6, and conntrack has no zones.
func norm(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }
