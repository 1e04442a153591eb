package netns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// TCP flags of a raw probe's answer.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPAck = 0x10
)

// RawFrame describes one IPv4 packet sent as an Ethernet frame from a
// namespace's interface, bypassing its routing: the way a neighbour on the
// same link can address any destination (127.0.0.1 included) to the node's MAC.
type RawFrame struct {
	Dev              string           // interface in the sending namespace
	DstMAC           net.HardwareAddr // the next hop's MAC (the node's)
	Src, Dst         netip.Addr       // IPv4 only
	Proto            uint8            // 6 TCP (a SYN is sent) or 132 SCTP (Payload is the whole SCTP packet)
	SrcPort, DstPort uint16
	Payload          []byte
	// TCPFlags are the flags of the TCP segment sent; 0 means SYN.
	TCPFlags uint8
}

// MAC returns the hardware address of an interface in the namespace.
func (n *NS) MAC(dev string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read MAC of %s in %s: %w", dev, n.name, err)
	}
	return mac, nil
}

// ProbeTCP sends f as a TCP SYN through an AF_PACKET socket and waits until
// ctx ends for the answer on the same interface: the TCP flags of the first
// segment from f.Dst:f.DstPort to f.Src:f.SrcPort (SYN|ACK when a listener
// answered, RST when the port is closed), or 0 when nothing came back.
func (n *NS) ProbeTCP(ctx context.Context, f RawFrame) (uint8, error) {
	f.Proto = unix.IPPROTO_TCP
	var flags uint8
	err := n.rawExchange(ctx, f, func(ip []byte) bool {
		tcp := ip[int(ip[0]&0x0f)*4:]
		if len(tcp) < 20 || ip[9] != unix.IPPROTO_TCP ||
			binary.BigEndian.Uint16(tcp[0:2]) != f.DstPort || binary.BigEndian.Uint16(tcp[2:4]) != f.SrcPort {
			return false
		}
		flags = tcp[13]
		return true
	})
	return flags, err
}

// rawExchange sends f's frame and hands every IPv4 packet from f.Dst to f.Src
// that arrives on f.Dev to match until match returns true or ctx ends.
func (n *NS) rawExchange(ctx context.Context, f RawFrame, match func(ip []byte) bool) error {
	fd, err := n.sendRaw(f)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return receiveIPv4(ctx, fd, f.Dev, func(ip []byte) bool {
		return netip.AddrFrom4([4]byte(ip[12:16])) == f.Dst && netip.AddrFrom4([4]byte(ip[16:20])) == f.Src && match(ip)
	})
}

// SendRaw sends f's frame without waiting for an answer; f.Payload is the
// whole layer 4 packet unless f.Proto is TCP.
func (n *NS) SendRaw(f RawFrame) error {
	fd, err := n.sendRaw(f)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// sendRaw sends f's frame from a packet socket bound to f.Dev and returns
// the socket, which receives the IPv4 packets of f.Dev from then on.
func (n *NS) sendRaw(f RawFrame) (int, error) {
	if !f.Src.Is4() || !f.Dst.Is4() {
		return -1, errors.New("raw probe: IPv4 addresses only")
	}
	fd, ifi, err := n.packetSocket(f.Dev)
	if err != nil {
		return -1, err
	}
	frame := append(append(append([]byte{}, f.DstMAC...), ifi.HardwareAddr...), 0x08, 0x00)
	frame = append(frame, ipv4Packet(f)...)
	if err := unix.Send(fd, frame, 0); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("send raw frame on %s: %w", f.Dev, err)
	}
	return fd, nil
}

// packetSocket opens an AF_PACKET socket of the namespace bound to dev,
// receiving IPv4.
func (n *NS) packetSocket(dev string) (int, *net.Interface, error) {
	var fd int
	var ifi *net.Interface
	err := n.Do(func() error {
		var err error
		if ifi, err = net.InterfaceByName(dev); err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		return err
	})
	if err != nil {
		return -1, nil, fmt.Errorf("open packet socket in %s: %w", n.name, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("bind packet socket to %s: %w", dev, err)
	}
	return fd, ifi, nil
}

// receiveIPv4 hands every IPv4 packet the packet socket fd receives from
// outside (not its own sending) to match, until match returns true (nil) or
// ctx ends (nil too: nothing matched).
func receiveIPv4(ctx context.Context, fd int, dev string, match func(ip []byte) bool) error {
	buf := make([]byte, 65536)
	for {
		left := time.Until(deadline(ctx))
		if left <= 0 {
			return nil
		}
		tv := unix.NsecToTimeval(min(left, 100*time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("set receive timeout: %w", err)
		}
		nr, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive on %s: %w", dev, err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own frame
		}
		ip := buf[14:nr]
		if len(ip) < 20 || ip[0]>>4 != 4 || int(ip[0]&0x0f)*4 > len(ip) {
			continue
		}
		if match(ip) {
			return nil
		}
	}
}

// ipv4Packet builds the IPv4 packet of f: a TCP SYN, or f.Payload as the
// layer 4 packet of another protocol.
func ipv4Packet(f RawFrame) []byte {
	l4 := f.Payload
	if f.Proto == unix.IPPROTO_TCP {
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:], f.SrcPort)
		binary.BigEndian.PutUint16(l4[2:], f.DstPort)
		binary.BigEndian.PutUint32(l4[4:], 0x1000)
		l4[12] = 5 << 4
		l4[13] = f.TCPFlags
		if l4[13] == 0 {
			l4[13] = TCPSyn
		}
		binary.BigEndian.PutUint16(l4[14:], 64240)
		src, dst := f.Src.As4(), f.Dst.As4()
		pseudo := append(append(append([]byte{}, src[:]...), dst[:]...), 0, unix.IPPROTO_TCP, 0, byte(len(l4)))
		binary.BigEndian.PutUint16(l4[16:], checksum(append(pseudo, l4...)))
	}
	ip := make([]byte, 20, 20+len(l4))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(ip[4:], 0x4242)
	ip[8] = 64
	ip[9] = f.Proto
	src, dst := f.Src.As4(), f.Dst.As4()
	copy(ip[12:], src[:])
	copy(ip[16:], dst[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	return append(ip, l4...)
}

// checksum is the Internet checksum (RFC 1071).
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
