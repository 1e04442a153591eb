package nftnl

import (
	"errors"
	"fmt"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// setUserData dumps the table's sets over netlink and returns each set's
// NFTA_SET_USERDATA as the kernel stores it: google/nftables reads only the
// parts it knows (comment, merge, data interval) and drops the rest, where a
// set declared with typeof keeps its expressions.
func setUserData(conn *Conn, f nftmodel.Family, table string) (map[string][]byte, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: conn.lib.NetNS})
	if err != nil {
		return nil, fmt.Errorf("dial netfilter socket: %w", err)
	}
	defer func() { _ = c.Close() }()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_TABLE, table)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, fmt.Errorf("encode set dump: %w", err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(nfproto(f)), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump sets: %w", err)
	}
	out := map[string][]byte{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("decode set: %w", err)
		}
		var name string
		var ud []byte
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_NAME:
				name = ad.String()
			case unix.NFTA_SET_USERDATA:
				ud = ad.Bytes()
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("decode set: %w", err)
		}
		out[name] = ud
	}
	return out, nil
}

// readTypeof parses the expressions of a set declared with typeof from its
// user data (see typeof.go), nil when it was declared by types. The
// caller writes the user data again from the result and compares.
func readTypeof(f nftmodel.Family, ud []byte) (*nftmodel.Typeof, error) {
	key := userdata.Get(ud, userdata.NFTNL_UDATA_SET_KEY_TYPEOF)
	if key == nil {
		return nil, nil
	}
	t := &nftmodel.Typeof{}
	parts, err := readConcat(f, key)
	if err != nil {
		return nil, fmt.Errorf("typeof key: %w", err)
	}
	for i, p := range parts {
		switch {
		case p.numgen == 0:
			t.Key = append(t.Key, p.field)
		case i == len(parts)-1:
			t.KeyNumgen = p.numgen
		default:
			return nil, errors.New("typeof key: numgen before the key's last part")
		}
	}
	if data := userdata.Get(ud, userdata.NFTNL_UDATA_SET_DATA_TYPEOF); data != nil {
		if parts, err = readConcat(f, data); err != nil {
			return nil, fmt.Errorf("typeof data: %w", err)
		}
		for _, p := range parts {
			if p.numgen > 0 {
				return nil, errors.New("typeof data: numgen")
			}
			t.Data = append(t.Data, p.field)
		}
	}
	return t, nil
}

// readConcat parses { 0: expression type, 1: { data } } where the type is a
// concatenation, into its parts.
func readConcat(f nftmodel.Family, b []byte) ([]typeofPart, error) {
	if typ, ok := userdata.GetUint32(b, 0); !ok || typ != exprTypeConcat {
		return nil, errors.New("not a concatenation")
	}
	data := userdata.Get(b, 1)
	var parts []typeofPart
	for i := 0; ; i++ {
		pb := userdata.Get(data, userdata.Type(i))
		if pb == nil {
			break
		}
		p, err := readTypeofPart(f, pb)
		if err != nil {
			return nil, fmt.Errorf("part %d: %w", i, err)
		}
		parts = append(parts, p)
	}
	if len(parts) < 2 {
		return nil, errors.New("a concatenation of fewer than 2 parts")
	}
	return parts, nil
}

// readTypeofPart parses one expression: a payload field, meta l4proto, or
// numgen random.
func readTypeofPart(f nftmodel.Family, b []byte) (typeofPart, error) {
	typ, _ := userdata.GetUint32(b, 0)
	data := userdata.Get(b, 1)
	u32 := func(t userdata.Type) uint32 { v, _ := userdata.GetUint32(data, t); return v }
	switch typ {
	case exprTypeNumgen:
		if u32(0) != numgenRandom || u32(1) == 0 {
			return typeofPart{}, errors.New("numgen other than random mod N")
		}
		return typeofPart{numgen: u32(1)}, nil
	case exprTypeMeta:
		if u32(0) == metaL4Proto {
			return typeofPart{field: nftmodel.FieldL4Proto}, nil
		}
	case exprTypePayload:
		desc, hdr := u32(0), u32(1)
		switch {
		case desc == protoDescTH && hdr == thDport:
			return typeofPart{field: nftmodel.FieldTHDport}, nil
		case f == nftmodel.IPv4 && desc == protoDescIP && hdr == ipSaddr, f == nftmodel.IPv6 && desc == protoDescIP6 && hdr == ip6Saddr:
			return typeofPart{field: nftmodel.FieldSaddr}, nil
		case f == nftmodel.IPv4 && desc == protoDescIP && hdr == ipDaddr, f == nftmodel.IPv6 && desc == protoDescIP6 && hdr == ip6Daddr:
			return typeofPart{field: nftmodel.FieldDaddr}, nil
		}
	}
	return typeofPart{}, fmt.Errorf("expression type %d %x is not in the model", typ, data)
}
