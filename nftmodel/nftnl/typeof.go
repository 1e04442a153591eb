package nftnl

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// A set declared with `typeof` carries the declaring expressions in its user
// data, in libnftnl's TLV format (type byte, length byte, value; numbers are
// 32-bit host-endian), where nft finds them to list the set. The kernel stores
// the bytes as given. This file writes the bytes nft 1.0.6 writes for the
// expressions the model has (read back from sets nft created, see
// TestTypeofUserDataMatchesNft):
//
//	KEYBYTEORDER   0 (a concatenation has none)
//	DATABYTEORDER  0 (maps only)
//	KEY_TYPEOF     { 0: expression type, 1: { expression data } }
//	DATA_TYPEOF    likewise
//	DATA_INTERVAL  0 (maps only)
//
// A concatenation's data holds, for part i, { 0: type, 1: { part's data } }
// under TLV type i.

// nft's expression types (enum expr_types).
const (
	exprTypePayload = 7
	exprTypeMeta    = 9
	exprTypeConcat  = 13
	exprTypeNumgen  = 23
)

// nft's protocol descriptions and header fields, for payload expressions.
const (
	protoDescTH   = 11 // PROTO_DESC_TH, the transport header
	protoDescIP   = 12
	protoDescIP6  = 13
	thDport       = 2 // THDR_DPORT
	ipSaddr       = 11
	ipDaddr       = 12
	ip6Saddr      = 8
	ip6Daddr      = 9
	numgenRandom  = unix.NFT_NG_RANDOM
	metaL4Proto   = unix.NFT_META_L4PROTO
	byteorderNone = 0 // BYTEORDER_INVALID: what a concatenation declares
)

// udata builds libnftnl user data.
type udata []byte

func (u udata) u32(typ byte, v uint32) udata {
	return hostEndian.AppendUint32(append(u, typ, 4), v)
}

// nest appends TLV typ holding what inner appends.
func (u udata) nest(typ byte, inner func(udata) (udata, error)) (udata, error) {
	start := len(u)
	u = append(u, typ, 0)
	u, err := inner(u)
	if err != nil {
		return nil, err
	}
	n := len(u) - start - 2
	if n > 255 {
		return nil, fmt.Errorf("user data TLV %d too long (%d bytes)", typ, n)
	}
	u[start+1] = byte(n)
	return u, nil
}

// typeofPart is one expression of a typeof key or value.
type typeofPart struct {
	field  nftmodel.Field
	numgen uint32 // > 0: numgen random mod numgen instead of field
}

func typeofParts(fields []nftmodel.Field, numgen uint32) []typeofPart {
	parts := make([]typeofPart, 0, len(fields)+1)
	for _, f := range fields {
		parts = append(parts, typeofPart{field: f})
	}
	if numgen > 0 {
		parts = append(parts, typeofPart{numgen: numgen})
	}
	return parts
}

// dataType is the type of the value a part produces.
func (p typeofPart) dataType(f nftmodel.Family) nftmodel.DataType {
	switch {
	case p.numgen > 0:
		return nftmodel.TypeInteger
	case p.field == nftmodel.FieldL4Proto:
		return nftmodel.TypeInetProto
	case p.field == nftmodel.FieldTHDport:
		return nftmodel.TypeInetService
	case f == nftmodel.IPv6:
		return nftmodel.TypeIPv6Addr
	}
	return nftmodel.TypeIPv4Addr
}

// appendExpr appends one part's expression type and data.
func (p typeofPart) appendExpr(f nftmodel.Family, u udata) (udata, error) {
	switch {
	case p.numgen > 0:
		u = u.u32(0, exprTypeNumgen)
		return u.nest(1, func(u udata) (udata, error) {
			return u.u32(0, numgenRandom).u32(1, p.numgen).u32(2, 0), nil // type, modulus, offset
		})
	case p.field == nftmodel.FieldL4Proto:
		u = u.u32(0, exprTypeMeta)
		return u.nest(1, func(u udata) (udata, error) { return u.u32(0, metaL4Proto), nil })
	}
	desc, hdr := uint32(protoDescTH), uint32(thDport)
	switch {
	case p.field == nftmodel.FieldTHDport:
	case f == nftmodel.IPv4 && p.field == nftmodel.FieldSaddr:
		desc, hdr = protoDescIP, ipSaddr
	case f == nftmodel.IPv4 && p.field == nftmodel.FieldDaddr:
		desc, hdr = protoDescIP, ipDaddr
	case p.field == nftmodel.FieldSaddr:
		desc, hdr = protoDescIP6, ip6Saddr
	case p.field == nftmodel.FieldDaddr:
		desc, hdr = protoDescIP6, ip6Daddr
	default:
		return nil, fmt.Errorf("no typeof expression for field %d", p.field)
	}
	u = u.u32(0, exprTypePayload)
	return u.nest(1, func(u udata) (udata, error) { return u.u32(0, desc).u32(1, hdr), nil })
}

// appendConcat appends a concatenation's expression type and data.
func appendConcat(f nftmodel.Family, u udata, parts []typeofPart) (udata, error) {
	u = u.u32(0, exprTypeConcat)
	return u.nest(1, func(u udata) (udata, error) {
		var err error
		for i, p := range parts {
			if u, err = u.nest(byte(i), func(u udata) (udata, error) { return p.appendExpr(f, u) }); err != nil {
				return nil, err
			}
		}
		return u, nil
	})
}

// typeofUserData returns the user data nft writes for a set declared with
// t, after checking that t gives the set's types. Only concatenations are
// supported: that is what nftproxy declares this way.
func typeofUserData(f nftmodel.Family, s *nftmodel.Set) ([]byte, error) {
	t := s.Typeof
	key := typeofParts(t.Key, t.KeyNumgen)
	data := typeofParts(t.Data, 0)
	if len(key) < 2 || len(s.Data) > 0 && len(data) < 2 {
		return nil, errors.New("typeof: only concatenations are supported")
	}
	types := func(parts []typeofPart) []nftmodel.DataType {
		out := make([]nftmodel.DataType, len(parts))
		for i, p := range parts {
			out[i] = p.dataType(f)
		}
		return out
	}
	if !slices.Equal(types(key), s.Key) || !slices.Equal(types(data), s.Data) {
		return nil, fmt.Errorf("typeof gives %s : %s, the set is declared %s : %s",
			nftmodel.RenderTypes(types(key)), nftmodel.RenderTypes(types(data)), nftmodel.RenderTypes(s.Key), nftmodel.RenderTypes(s.Data))
	}
	u := udata(nil).u32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), byteorderNone)
	if len(data) > 0 {
		u = u.u32(byte(userdata.NFTNL_UDATA_SET_DATABYTEORDER), byteorderNone)
	}
	u, err := u.nest(byte(userdata.NFTNL_UDATA_SET_KEY_TYPEOF), func(u udata) (udata, error) { return appendConcat(f, u, key) })
	if err != nil {
		return nil, err
	}
	if len(data) > 0 {
		if u, err = u.nest(byte(userdata.NFTNL_UDATA_SET_DATA_TYPEOF), func(u udata) (udata, error) { return appendConcat(f, u, data) }); err != nil {
			return nil, err
		}
		// nft says of every map whether its values are intervals.
		u = u.u32(byte(userdata.NFTNL_UDATA_SET_DATA_INTERVAL), 0)
	}
	return u, nil
}

// withUserData returns a set message's data (nfgen header, attributes) with
// its NFTA_SET_USERDATA attribute, if any, replaced by u.
func withUserData(msg []byte, u []byte) ([]byte, error) {
	const nfgenLen = 4
	if len(msg) < nfgenLen {
		return nil, errors.New("set message too short")
	}
	out := make([]byte, 0, len(msg)+attrSize(len(u)))
	out = append(out, msg[:nfgenLen]...)
	for rest := msg[nfgenLen:]; len(rest) > 0; {
		if len(rest) < attrHeaderLen {
			return nil, errors.New("set message: truncated attribute")
		}
		n := int(hostEndian.Uint16(rest[:2]))
		if n < attrHeaderLen || n > len(rest) {
			return nil, errors.New("set message: bad attribute length")
		}
		typ := hostEndian.Uint16(rest[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		next := min(align4(n), len(rest))
		if typ != unix.NFTA_SET_USERDATA {
			out = append(out, rest[:next]...)
		}
		rest = rest[next:]
	}
	out = hostEndian.AppendUint16(out, uint16(attrHeaderLen+len(u)))
	out = hostEndian.AppendUint16(out, unix.NFTA_SET_USERDATA)
	out = append(out, u...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return out, nil
}
