package features

import (
	"bytes"
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// Netlink attributes are host-endian: length (header included), type, value
// padded to 4 bytes.
const attrHeaderLen = 4

func align4(n int) int { return (n + 3) &^ 3 }

// attrs calls fn with the type (flags cleared), value and whole bytes of
// each attribute in b; fn returns false to stop.
func attrs(b []byte, fn func(typ uint16, value, whole []byte) bool) error {
	for len(b) > 0 {
		if len(b) < attrHeaderLen {
			return errors.New("truncated attribute")
		}
		n := int(binary.NativeEndian.Uint16(b[:2]))
		if n < attrHeaderLen || n > len(b) {
			return errors.New("bad attribute length")
		}
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		next := min(align4(n), len(b))
		if !fn(typ, b[attrHeaderLen:n], b[:next]) {
			return nil
		}
		b = b[next:]
	}
	return nil
}

// stringAttr returns the NUL-terminated string attribute typ of b.
func stringAttr(b []byte, typ uint16) (string, bool) {
	var s string
	found := false
	_ = attrs(b, func(t uint16, v, _ []byte) bool {
		if t == typ {
			s, found = string(bytes.TrimRight(v, "\x00")), true
		}
		return !found
	})
	return s, found
}

// withUserData returns a set message's data (nfgen header, attributes) with
// its NFTA_SET_USERDATA attribute replaced by u.
func withUserData(msg []byte, u []byte) ([]byte, error) {
	const nfgenLen = 4
	out := append(make([]byte, 0, len(msg)+attrHeaderLen+len(u)+3), msg[:nfgenLen]...)
	err := attrs(msg[nfgenLen:], func(t uint16, _, whole []byte) bool {
		if t != unix.NFTA_SET_USERDATA {
			out = append(out, whole...)
			for len(out)%4 != 0 {
				out = append(out, 0)
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	out = binary.NativeEndian.AppendUint16(out, uint16(attrHeaderLen+len(u)))
	out = binary.NativeEndian.AppendUint16(out, unix.NFTA_SET_USERDATA)
	out = append(out, u...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return out, nil
}
