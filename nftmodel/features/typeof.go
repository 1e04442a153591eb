package features

import (
	"encoding/binary"

	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// A set declared with `typeof` carries its declaring expressions in its user
// data, in libnftnl's TLV format (type byte, length byte, value; numbers
// 32-bit host-endian); the kernel keeps the bytes. endpointsTypeof writes
// what nft 1.0.6 writes for nftproxy's endpoints map,
//
//	typeof ip daddr . meta l4proto . th dport . numgen random mod 65536 : ip daddr . th dport
//
// so that the probe sends user data of the size nftproxy sends.
func endpointsTypeof(ipv6 bool) []byte {
	// nft's expression types, protocol descriptions and header fields.
	const (
		exprPayload, exprMeta, exprConcat, exprNumgen = 7, 9, 13, 23
		descTH, descIP, descIP6                       = 11, 12, 13
		thDport, ipDaddr, ip6Daddr                    = 2, 12, 9
	)
	desc, daddr := uint32(descIP), uint32(ipDaddr)
	if ipv6 {
		desc, daddr = descIP6, ip6Daddr
	}
	payload := func(desc, field uint32) tlvs {
		return tlvs{}.u32(0, exprPayload).nest(1, tlvs{}.u32(0, desc).u32(1, field))
	}
	meta := tlvs{}.u32(0, exprMeta).nest(1, tlvs{}.u32(0, unix.NFT_META_L4PROTO))
	numgen := tlvs{}.u32(0, exprNumgen).nest(1, tlvs{}.u32(0, unix.NFT_NG_RANDOM).u32(1, 65536).u32(2, 0))
	concat := func(parts ...tlvs) tlvs {
		var inner tlvs
		for i, p := range parts {
			inner = inner.nest(userdata.Type(i), p)
		}
		return tlvs{}.u32(0, exprConcat).nest(1, inner)
	}
	return tlvs{}.
		u32(userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 0).
		u32(userdata.NFTNL_UDATA_SET_DATABYTEORDER, 0).
		nest(userdata.NFTNL_UDATA_SET_KEY_TYPEOF, concat(payload(desc, daddr), meta, payload(descTH, thDport), numgen)).
		nest(userdata.NFTNL_UDATA_SET_DATA_TYPEOF, concat(payload(desc, daddr), payload(descTH, thDport))).
		u32(userdata.NFTNL_UDATA_SET_DATA_INTERVAL, 0)
}

// tlvs builds libnftnl user data.
type tlvs []byte

func (t tlvs) u32(typ userdata.Type, v uint32) tlvs {
	return binary.NativeEndian.AppendUint32(append(t, byte(typ), 4), v)
}

// nest appends inner as the value of TLV typ (inner is at most 255 bytes
// here, as libnftnl requires).
func (t tlvs) nest(typ userdata.Type, inner tlvs) tlvs {
	return append(append(t, byte(typ), byte(len(inner))), inner...)
}
