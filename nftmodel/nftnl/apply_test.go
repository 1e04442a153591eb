package nftnl

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// What the recorder answers to the reads of a full Apply, encoded the way
// the kernel describes its objects.

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func nftMsg(t *testing.T, typ int, family uint8, seq uint32, attrs []netlink.Attribute) netlink.Message {
	t.Helper()
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Sequence: seq},
		Data:   append([]byte{family, 0, 0, 0}, data...),
	}
}

// setMessage describes s in table as the kernel does in a NEWSET message.
func setMessage(t *testing.T, table string, s *nftmodel.Set, seq uint32) netlink.Message {
	t.Helper()
	ls, err := libSet(&nftables.Table{Name: table}, s)
	if err != nil {
		t.Fatal(err)
	}
	flags := uint32(0)
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(s.Name + "\x00")},
		{Type: unix.NFTA_SET_KEY_TYPE, Data: be32(ls.KeyType.GetNFTMagic())},
		{Type: unix.NFTA_SET_KEY_LEN, Data: be32(ls.KeyType.Bytes)},
	}
	if ls.IsMap {
		flags |= unix.NFT_SET_MAP
		magic, size := ls.DataType.GetNFTMagic(), ls.DataType.Bytes
		if s.IsVerdictMap() {
			magic, size = unix.NFT_DATA_VERDICT, 16
		}
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_SET_DATA_TYPE, Data: be32(magic)},
			netlink.Attribute{Type: unix.NFTA_SET_DATA_LEN, Data: be32(size)})
	}
	if ls.HasTimeout {
		flags |= unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_SET_TIMEOUT, Data: binary.BigEndian.AppendUint64(nil, uint64(ls.Timeout.Milliseconds()))},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_DESC, Data: nltest.MustMarshalAttributes([]netlink.Attribute{
				{Type: unix.NFTA_SET_DESC_SIZE, Data: be32(ls.Size)},
			})})
	}
	attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_FLAGS, Data: be32(flags)})
	return nftMsg(t, unix.NFT_MSG_NEWSET, unix.NFPROTO_IPV4, seq, attrs)
}

// chainMessage describes c in table as the kernel does in a NEWCHAIN message.
func chainMessage(t *testing.T, table string, c *nftmodel.Chain, seq uint32) netlink.Message {
	t.Helper()
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: []byte(table + "\x00")},
		{Type: unix.NFTA_CHAIN_NAME, Data: []byte(c.Name + "\x00")},
	}
	if c.Base != nil {
		lc := libChain(&nftables.Table{Name: table}, c)
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_CHAIN_HOOK, Data: nltest.MustMarshalAttributes([]netlink.Attribute{
				{Type: unix.NFTA_HOOK_HOOKNUM, Data: be32(uint32(*lc.Hooknum))},
				{Type: unix.NFTA_HOOK_PRIORITY, Data: be32(uint32(*lc.Priority))},
			})},
			netlink.Attribute{Type: unix.NFTA_CHAIN_POLICY, Data: be32(uint32(*lc.Policy))},
			netlink.Attribute{Type: unix.NFTA_CHAIN_TYPE, Data: []byte(string(lc.Type) + "\x00")})
	}
	return nftMsg(t, unix.NFT_MSG_NEWCHAIN, unix.NFPROTO_IPV4, seq, attrs)
}

func (r *recorder) genReply(req netlink.Message) netlink.Message {
	return nftMsg(r.t, unix.NFT_MSG_NEWGEN, 0, req.Header.Sequence, []netlink.Attribute{{Type: unix.NFTA_GEN_ID, Data: be32(r.gen)}})
}

// errorReply is the kernel's error answer to req. (nltest.Error keeps the
// request's flags, and the dump flags of a request mean "capped" and "ack
// TLVs" in an error message.)
func errorReply(errno unix.Errno, req netlink.Message) ([]netlink.Message, error) {
	req.Header.Flags = 0
	return nltest.Error(int(errno), []netlink.Message{req})
}

func (r *recorder) tableReply(req netlink.Message) ([]netlink.Message, error) {
	if r.table == nil {
		return errorReply(unix.ENOENT, req)
	}
	return []netlink.Message{nftMsg(r.t, unix.NFT_MSG_NEWTABLE, unix.NFPROTO_IPV4, req.Header.Sequence, []netlink.Attribute{
		{Type: unix.NFTA_TABLE_NAME, Data: []byte(r.table.Table + "\x00")},
		{Type: unix.NFTA_TABLE_FLAGS, Data: be32(uint32(r.flags))},
		{Type: unix.NFTA_TABLE_USE, Data: be32(uint32(len(r.table.Chains)))},
	})}, nil
}

// dump ends a dump's messages the way the kernel does.
func dump(msgs []netlink.Message, seq uint32) ([]netlink.Message, error) {
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Sequence: seq}})
	for i := range msgs {
		msgs[i].Header.Flags |= netlink.Multi
	}
	msgs[len(msgs)-1].Header.Type = netlink.Done
	return msgs, nil
}

func (r *recorder) setsDump(req netlink.Message) ([]netlink.Message, error) {
	if r.table == nil {
		return errorReply(unix.ENOENT, req)
	}
	var msgs []netlink.Message
	for _, s := range r.table.Sets {
		msgs = append(msgs, setMessage(r.t, r.table.Table, s, req.Header.Sequence))
	}
	return dump(msgs, req.Header.Sequence)
}

func (r *recorder) chainsDump(req netlink.Message) ([]netlink.Message, error) {
	var msgs []netlink.Message
	// Another table's chain of the same name, which Apply must ignore.
	msgs = append(msgs, chainMessage(r.t, "other", &nftmodel.Chain{Name: "svc"}, req.Header.Sequence))
	if r.table != nil {
		for _, c := range r.table.Chains {
			msgs = append(msgs, chainMessage(r.t, r.table.Table, c, req.Header.Sequence))
		}
	}
	return dump(msgs, req.Header.Sequence)
}

// describe names a message and the object it is about, e.g. "DELSET old":
// the chain of a rule, the set of elements; nothing for a table-wide one.
func describe(t *testing.T, m netlink.Message) string {
	t.Helper()
	typ := msgType(m)
	var nameAttr uint16
	switch typ {
	case "NEWCHAIN", "DELCHAIN":
		nameAttr = unix.NFTA_CHAIN_NAME
	case "NEWRULE", "DELRULE":
		nameAttr = unix.NFTA_RULE_CHAIN
	case "NEWSET", "DELSET":
		nameAttr = unix.NFTA_SET_NAME
	case "NEWSETELEM", "DELSETELEM":
		nameAttr = unix.NFTA_SET_ELEM_LIST_SET
	default:
		return typ
	}
	attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		if a.Type == nameAttr {
			return typ + " " + string(a.Data[:len(a.Data)-1])
		}
	}
	return typ
}

// batchGenID returns the generation a batch begin message carries, 0 if none.
func batchGenID(t *testing.T, begin netlink.Message) uint32 {
	t.Helper()
	return u32Attr(t, begin, unix.NFNL_BATCH_GENID)
}

// u32Attr returns the big-endian 32-bit attribute typ of an nfnetlink
// message, 0 if it has none.
func u32Attr(t *testing.T, m netlink.Message, typ uint16) uint32 {
	t.Helper()
	attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attrs {
		if a.Type == typ {
			return binary.BigEndian.Uint32(a.Data)
		}
	}
	return 0
}

// TestApplyReconciles checks the batch a full Apply sends into a table that
// exists: what stays is emptied, not recreated; what differs goes first.
func TestApplyReconciles(t *testing.T) {
	vmap := func(name string, chains ...string) *nftmodel.Set {
		s := &nftmodel.Set{Name: name, Key: []nftmodel.DataType{nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}}
		for i, c := range chains {
			s.Elements = append(s.Elements, nftmodel.Element{Key: []nftmodel.Value{nftmodel.N(uint32(80 + i))}, Verdict: nlGoto(c)})
		}
		return s
	}
	affinity := func(timeout time.Duration) *nftmodel.Set {
		return &nftmodel.Set{Name: "affinity", Key: []nftmodel.DataType{nftmodel.TypeIPv4Addr}, Timeout: timeout}
	}
	pre := func(prio int32) *nftmodel.Chain {
		return nlBase("pre", nftmodel.TypeNAT, nftmodel.HookPrerouting, prio, nlRule(nftmodel.VerdictMap{Key: []nftmodel.Field{nftmodel.FieldTHDport}, Map: "ports"}))
	}
	svc := &nftmodel.Chain{Name: "svc", Rules: []nftmodel.Rule{nlRule(nftmodel.UpdateSet{Key: []nftmodel.Field{nftmodel.FieldSaddr}, Set: "affinity"}), nlRule(nftmodel.Verdict{Kind: nftmodel.Accept})}}
	desired := &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t",
		Sets:   []*nftmodel.Set{vmap("ports", "svc"), affinity(time.Hour)},
		Chains: []*nftmodel.Chain{pre(-100), svc},
	}
	tests := []struct {
		name      string
		kernel    *nftmodel.Ruleset
		flags     nftables.TableFlags
		want      []string
		wantStats nftmodel.Stats
	}{
		{
			name:   "table as desired: chains and affinity kept, other sets flushed and refilled",
			kernel: desired,
			want: []string{"BEGIN", "NEWTABLE",
				"DELRULE",
				"DELSETELEM ports",
				"NEWRULE pre", "NEWRULE svc", "NEWRULE svc",
				"NEWSETELEM ports",
				"END"},
			wantStats: nftmodel.Stats{Messages: 9, Elements: 1, Rules: 3, Sets: 1, Kept: 1},
		},
		{
			name: "everything differs: stale and changed objects deleted, then added",
			kernel: &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t",
				Sets: []*nftmodel.Set{
					affinity(2 * time.Hour),      // timeout changed
					vmap("old-map", "old-chain"), // not desired; points at a chain that goes
					{Name: "ports", Key: []nftmodel.DataType{nftmodel.TypeInetProto}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}}, // key type changed
				},
				Chains: []*nftmodel.Chain{{Name: "old-chain"}, pre(0), {Name: "svc", Base: &nftmodel.BaseChain{Type: nftmodel.TypeFilter, Hook: nftmodel.HookInput}}},
			},
			want: []string{"BEGIN", "NEWTABLE",
				"DELRULE",
				"DELSET affinity", "DELSET old-map", "DELSET ports",
				"DELCHAIN old-chain", "DELCHAIN pre", "DELCHAIN svc",
				"NEWSET ports", "NEWSET affinity",
				"NEWCHAIN pre", "NEWCHAIN svc",
				"NEWRULE pre", "NEWRULE svc", "NEWRULE svc",
				"NEWSETELEM ports",
				"END"},
			wantStats: nftmodel.Stats{Messages: 18, Elements: 1, Rules: 3, Chains: 5, Sets: 5},
		},
		{
			name:   "dormant table: recreated",
			kernel: desired,
			flags:  nftables.TableFlagDormant,
			want: []string{"BEGIN", "NEWTABLE", "DELTABLE", "NEWTABLE",
				"NEWSET ports", "NEWSET affinity",
				"NEWCHAIN pre", "NEWCHAIN svc",
				"NEWRULE pre", "NEWRULE svc", "NEWRULE svc",
				"NEWSETELEM ports",
				"END"},
			wantStats: nftmodel.Stats{Messages: 13, Elements: 1, Rules: 3, Chains: 2, Sets: 2},
		},
		{
			name:   "empty table: no rule flush",
			kernel: &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t"},
			want: []string{"BEGIN", "NEWTABLE",
				"NEWSET ports", "NEWSET affinity",
				"NEWCHAIN pre", "NEWCHAIN svc",
				"NEWRULE pre", "NEWRULE svc", "NEWRULE svc",
				"NEWSETELEM ports",
				"END"},
			wantStats: nftmodel.Stats{Messages: 11, Elements: 1, Rules: 3, Chains: 2, Sets: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, conn := newRecorder(t)
			r.table, r.flags, r.gen = tt.kernel, tt.flags, 4711
			stats, err := Apply(conn, desired)
			if err != nil {
				t.Fatal(err)
			}
			batch := r.lastBatch()
			var got []string
			for _, m := range batch {
				got = append(got, describe(t, m))
			}
			if d := gocmp.Diff(tt.want, got); d != "" {
				t.Errorf("messages (-want +got):\n%s", d)
			}
			if stats != tt.wantStats {
				t.Errorf("stats = %+v, want %+v", stats, tt.wantStats)
			}
			if gen := batchGenID(t, batch[0]); gen != r.gen {
				t.Errorf("batch carries generation %d, want %d", gen, r.gen)
			}
		})
	}
}

// A refused batch is retried after the ruleset changed under Apply: the
// kernel answers ERESTART to a batch whose generation is stale. The last
// attempt goes without a generation.
func TestApplyRetriesStaleGeneration(t *testing.T) {
	var gens []uint32
	dial := func(req []netlink.Message) ([]netlink.Message, error) {
		switch {
		case len(req) == 0:
			return nil, nil
		case req[0].Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN):
			gens = append(gens, batchGenID(t, req[0]))
			if len(gens) < maxApplyAttempts {
				return errorReply(unix.ERESTART, req[0])
			}
			return nil, nil
		case msgType(req[0]) == "GETGEN":
			return []netlink.Message{nftMsg(t, unix.NFT_MSG_NEWGEN, 0, req[0].Header.Sequence,
				[]netlink.Attribute{{Type: unix.NFTA_GEN_ID, Data: be32(uint32(10 + len(gens)))}})}, nil
		case msgType(req[0]) == "GETTABLE":
			return errorReply(unix.ENOENT, req[0])
		}
		return nil, fmt.Errorf("unexpected request %s", msgType(req[0]))
	}
	if _, err := Apply(dialConn(t, dial), &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t"}); err != nil {
		t.Fatal(err)
	}
	if d := gocmp.Diff([]uint32{10, 11, 0}, gens); d != "" {
		t.Errorf("generations of the batches (-want +got):\n%s", d)
	}
}
