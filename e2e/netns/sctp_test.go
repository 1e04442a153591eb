package netns

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
	"testing"
)

func TestSCTPInit(t *testing.T) {
	// RFC 3720's CRC32c check value: 32 zero bytes give 0x8a9136aa.
	if got := crc32.Checksum(make([]byte, 32), castagnoli); got != 0x8a9136aa {
		t.Fatalf("crc32c of 32 zero bytes = %#x, want 0x8a9136aa", got)
	}
	p := SCTPInit(43000, 3868, 0x5c7a0001)
	if !SCTPChecksumOK(p) {
		t.Error("SCTPInit's checksum is wrong")
	}
	ip := make([]byte, 20, 20+len(p))
	ip[0], ip[9] = 0x45, 132
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(p)))
	copy(ip[12:], []byte{192, 168, 77, 2})
	copy(ip[16:], []byte{10, 96, 0, 30})
	got, ok := ParseSCTPInit(append(ip, p...))
	want := SCTPInitSeen{Src: netip.MustParseAddrPort("192.168.77.2:43000"), Dst: netip.MustParseAddrPort("10.96.0.30:3868"),
		Tag: 0x5c7a0001, ChecksumOK: true}
	if !ok || got != want {
		t.Errorf("ParseSCTPInit = %+v, %v; want %+v", got, ok, want)
	}
	p[20] ^= 1 // a changed byte
	if SCTPChecksumOK(p) {
		t.Error("a changed packet still has a right checksum")
	}
}
