package netns

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"net/netip"

	"golang.org/x/sys/unix"
)

// SCTP over raw frames, for kernels without SCTP sockets: conntrack and NAT
// handle SCTP whether or not the kernel can terminate it.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInitChunk is the INIT chunk's type.
const sctpInitChunk = 1

// SCTPInit returns an SCTP packet from srcPort to dstPort holding one INIT
// chunk whose initiate tag is tag (non-zero), with its CRC32c checksum.
func SCTPInit(srcPort, dstPort uint16, tag uint32) []byte {
	p := make([]byte, 12+20)
	binary.BigEndian.PutUint16(p[0:], srcPort)
	binary.BigEndian.PutUint16(p[2:], dstPort)
	// Verification tag 0: an INIT has none yet.
	c := p[12:]
	c[0] = sctpInitChunk
	binary.BigEndian.PutUint16(c[2:], 20)
	binary.BigEndian.PutUint32(c[4:], tag)    // initiate tag
	binary.BigEndian.PutUint32(c[8:], 65535)  // advertised receiver window
	binary.BigEndian.PutUint16(c[12:], 1)     // outbound streams
	binary.BigEndian.PutUint16(c[14:], 1)     // inbound streams
	binary.BigEndian.PutUint32(c[16:], tag^1) // initial TSN
	binary.LittleEndian.PutUint32(p[8:], crc32.Checksum(p, castagnoli))
	return p
}

// SCTPChecksumOK tells whether an SCTP packet's CRC32c is right. The
// checksum is computed with its own field zeroed and, as Linux does, stored
// little-endian (RFC 9260, appendix A).
func SCTPChecksumOK(p []byte) bool {
	if len(p) < 12 {
		return false
	}
	sum := binary.LittleEndian.Uint32(p[8:])
	c := append([]byte{}, p...)
	clear(c[8:12])
	return crc32.Checksum(c, castagnoli) == sum
}

// SCTPInitSeen is an SCTP INIT as a sniffer saw it.
type SCTPInitSeen struct {
	Src, Dst   netip.AddrPort
	Tag        uint32 // the initiate tag
	ChecksumOK bool
}

// ParseSCTPInit returns the INIT an IPv4 packet holds as its first chunk.
func ParseSCTPInit(ip []byte) (SCTPInitSeen, bool) {
	hl := int(ip[0]&0x0f) * 4
	if len(ip) < hl+12+20 || ip[9] != unix.IPPROTO_SCTP {
		return SCTPInitSeen{}, false
	}
	p := ip[hl:]
	if tot := int(binary.BigEndian.Uint16(ip[2:4])); tot >= hl && tot <= len(ip) {
		p = ip[hl:tot]
	}
	if p[12] != sctpInitChunk {
		return SCTPInitSeen{}, false
	}
	return SCTPInitSeen{
		Src:        netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(p[0:])),
		Dst:        netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(p[2:])),
		Tag:        binary.BigEndian.Uint32(p[16:]),
		ChecksumOK: SCTPChecksumOK(p),
	}, true
}

// Sniffer captures the IPv4 packets arriving on one interface of a
// namespace, from the moment it is opened.
type Sniffer struct {
	fd  int
	dev string
}

// Sniff opens a sniffer on dev in the namespace.
func (n *NS) Sniff(dev string) (*Sniffer, error) {
	fd, _, err := n.packetSocket(dev)
	if err != nil {
		return nil, err
	}
	return &Sniffer{fd: fd, dev: dev}, nil
}

// Wait hands the captured packets (IPv4 header on) to match until it
// returns true, and then returns true; false when ctx ends first.
func (s *Sniffer) Wait(ctx context.Context, match func(ip []byte) bool) (bool, error) {
	found := false
	err := receiveIPv4(ctx, s.fd, s.dev, func(ip []byte) bool {
		found = match(ip)
		return found
	})
	return found, err
}

// Close closes the sniffer's socket.
func (s *Sniffer) Close() error { return unix.Close(s.fd) }
