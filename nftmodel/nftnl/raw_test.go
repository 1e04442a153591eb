package nftnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// A raw batch goes out as the library encodes it, in order, framed and
// numbered as the applier's batches; a typeof set carries the user data the
// applier writes for the same declaration; a refused message is named by
// what it asked and its family.
func TestRawBatch(t *testing.T) {
	decl := &nftmodel.Set{Name: "endpoints",
		Key:  []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService, nftmodel.TypeInteger},
		Data: []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetService},
		Typeof: &nftmodel.Typeof{Key: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldL4Proto, nftmodel.FieldTHDport},
			KeyNumgen: 65536, Data: []nftmodel.Field{nftmodel.FieldDaddr, nftmodel.FieldTHDport}}}
	wantUserData, err := typeofUserData(nftmodel.IPv6, decl)
	if err != nil {
		t.Fatal(err)
	}
	queue := func() *RawBatch {
		b := NewRawBatch()
		tab := b.AddTable(nftmodel.IPv6, "probe", true)
		b.Lib().AddChain(&nftables.Chain{Name: "c", Table: tab})
		key, _ := nftables.ConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
		data, _ := nftables.ConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)
		ls := &nftables.Set{Table: tab, Name: "endpoints", KeyType: key, DataType: data, IsMap: true}
		els := []nftables.SetElement{{Key: make([]byte, 28), Val: make([]byte, 20)}}
		if err := b.AddTypeofSet(nftmodel.IPv6, ls, els, decl); err != nil {
			t.Fatal(err)
		}
		b.Lib().AddChain(&nftables.Chain{Name: "d", Table: tab})
		return b
	}

	var sent []netlink.Message
	refuse := -1 // index in the batch of the message the "kernel" refuses
	conn := dialConn(t, func(req []netlink.Message) ([]netlink.Message, error) {
		sent = req
		if refuse < 0 {
			return nil, nil
		}
		code := -int32(unix.ENOENT)
		return []netlink.Message{{Header: netlink.Header{Type: netlink.Error, Sequence: req[refuse].Header.Sequence},
			Data: binary.NativeEndian.AppendUint32(nil, uint32(code))}}, nil
	})

	if err := queue().Send(conn); err != nil {
		t.Fatalf("Send() = %v", err)
	}
	want := []string{"BEGIN", "NEWTABLE", "NEWCHAIN", "NEWSET", "NEWSETELEM", "NEWCHAIN", "END"}
	if got := msgTypes(sent); !slices.Equal(got, want) {
		t.Fatalf("batch %v, want %v", got, want)
	}
	for i, m := range sent[1:] {
		if m.Header.Sequence != sent[0].Header.Sequence+uint32(i+1) {
			t.Errorf("message %d numbered %d after a begin numbered %d", i+1, m.Header.Sequence, sent[0].Header.Sequence)
		}
	}
	attrs, err := netlink.UnmarshalAttributes(sent[3].Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	var userData []byte
	for _, a := range attrs {
		if a.Type == unix.NFTA_SET_USERDATA {
			userData = a.Data
		}
	}
	if !bytes.Equal(userData, wantUserData) {
		t.Errorf("set user data %x, want the applier's %x", userData, wantUserData)
	}

	for _, tt := range []struct {
		refuse int
		want   string
	}{
		{1, "add table ip6: no such file or directory"},
		{5, "add chain ip6: no such file or directory"},
		{0, "commit nftables batch: no such file or directory"},
	} {
		refuse = tt.refuse
		err := queue().Send(conn)
		var r *RefusedError
		if !errors.As(err, &r) || !errors.Is(err, unix.ENOENT) || err.Error() != tt.want {
			t.Errorf("refused message %d: Send() = %v, want a RefusedError %q", tt.refuse, err, tt.want)
		}
		if tt.refuse == 1 && r != nil && r.Verb != VerbAddTable {
			t.Errorf("refused table: verb %q, want %q", r.Verb, VerbAddTable)
		}
	}
}
