package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// recorder is a test dialer: it keeps every batch sent to it and answers a
// GETSET with the set of that name from sets. It answers the reads of a full
// Apply (GETGEN, and dumps of sets and chains) from table, as the kernel
// would describe it: no such table when nil.
type recorder struct {
	t       *testing.T
	batches [][]netlink.Message
	sets    map[string]*nftmodel.Set
	table   *nftmodel.Ruleset
	flags   nftables.TableFlags // of table
	gen     uint32
}

func newRecorder(t *testing.T, sets ...*nftmodel.Set) (*recorder, *Conn) {
	r := &recorder{t: t, sets: map[string]*nftmodel.Set{}}
	for _, s := range sets {
		r.sets[s.Name] = s
	}
	return r, dialConn(t, r.dial)
}

// dialConn is a Conn whose reads (through the library) and batches go to
// dial instead of the kernel.
func dialConn(t *testing.T, dial func([]netlink.Message) ([]netlink.Message, error)) *Conn {
	lib, err := nftables.New(nftables.WithTestDial(dial))
	if err != nil {
		t.Fatal(err)
	}
	return &Conn{lib: lib, open: func() (BatchSocket, error) { return &dialerSocket{dial: dial}, nil }}
}

// dialerSocket is a batch socket that hands each batch's messages to a test
// dialer and gives its replies back as the kernel's.
type dialerSocket struct {
	dial    func([]netlink.Message) ([]netlink.Message, error)
	replies []byte
}

func (s *dialerSocket) Send(batch []byte, _ int, _ time.Time) error {
	msgs, err := splitMessages(batch)
	if err != nil {
		return fmt.Errorf("parse batch: %w", err)
	}
	replies, err := s.dial(msgs)
	if err != nil {
		return err
	}
	for _, m := range replies {
		n := nlmsgHeaderLen + len(m.Data)
		s.replies = binary.NativeEndian.AppendUint32(s.replies, uint32(n))
		s.replies = binary.NativeEndian.AppendUint16(s.replies, uint16(m.Header.Type))
		s.replies = binary.NativeEndian.AppendUint16(s.replies, uint16(m.Header.Flags))
		s.replies = binary.NativeEndian.AppendUint32(s.replies, m.Header.Sequence)
		s.replies = binary.NativeEndian.AppendUint32(s.replies, m.Header.PID)
		s.replies = append(s.replies, m.Data...)
		s.replies = append(s.replies, make([]byte, align4(n)-n)...)
	}
	return nil
}

// Receive gives all replies in one read, then none.
func (s *dialerSocket) Receive(buf []byte) (int, error) {
	if len(s.replies) == 0 {
		return 0, unix.EAGAIN
	}
	if len(s.replies) > len(buf) {
		return 0, fmt.Errorf("replies of %d bytes, read buffer of %d", len(s.replies), len(buf))
	}
	n := copy(buf, s.replies)
	s.replies = nil
	return n, nil
}

func (s *dialerSocket) PortID() uint32 { return 0 }
func (s *dialerSocket) Close() error   { return nil }

func (r *recorder) dial(req []netlink.Message) ([]netlink.Message, error) {
	switch {
	case len(req) == 0: // the library polling for more replies
		return nil, nil
	case req[0].Header.Type == netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN):
		r.batches = append(r.batches, slices.Clone(req))
		return nil, nil
	case msgType(req[0]) == "GETGEN":
		return []netlink.Message{r.genReply(req[0])}, nil
	case msgType(req[0]) == "GETTABLE":
		return r.tableReply(req[0])
	case msgType(req[0]) == "GETSET" && req[0].Header.Flags&netlink.Dump != 0:
		return r.setsDump(req[0])
	case msgType(req[0]) == "GETCHAIN":
		return r.chainsDump(req[0])
	case msgType(req[0]) == "GETSET":
		return []netlink.Message{r.setReply(req[0])}, nil
	}
	r.t.Errorf("unexpected request %s", msgType(req[0]))
	return nil, nil
}

// setReply describes a set the way the kernel does in a NEWSET message.
func (r *recorder) setReply(req netlink.Message) netlink.Message {
	attrs, err := netlink.UnmarshalAttributes(req.Data[4:])
	if err != nil {
		r.t.Fatal(err)
	}
	var name string
	for _, a := range attrs {
		if a.Type == unix.NFTA_SET_NAME {
			name = string(a.Data[:len(a.Data)-1])
		}
	}
	s := r.sets[name]
	if s == nil {
		r.t.Fatalf("GETSET for unknown set %q", name)
	}
	return setMessage(r.t, "t", s, req.Header.Sequence)
}

func (r *recorder) lastBatch() []netlink.Message {
	r.t.Helper()
	if len(r.batches) == 0 {
		r.t.Fatal("no batch was sent")
	}
	return r.batches[len(r.batches)-1]
}

var msgNames = map[int]string{
	unix.NFT_MSG_NEWTABLE: "NEWTABLE", unix.NFT_MSG_DELTABLE: "DELTABLE",
	unix.NFT_MSG_NEWCHAIN: "NEWCHAIN", unix.NFT_MSG_DELCHAIN: "DELCHAIN",
	unix.NFT_MSG_NEWRULE: "NEWRULE", unix.NFT_MSG_DELRULE: "DELRULE",
	unix.NFT_MSG_NEWSET: "NEWSET", unix.NFT_MSG_DELSET: "DELSET", unix.NFT_MSG_GETSET: "GETSET",
	unix.NFT_MSG_NEWSETELEM: "NEWSETELEM", unix.NFT_MSG_DELSETELEM: "DELSETELEM",
	unix.NFT_MSG_GETGEN: "GETGEN", unix.NFT_MSG_GETCHAIN: "GETCHAIN", unix.NFT_MSG_GETTABLE: "GETTABLE",
}

func msgType(m netlink.Message) string {
	switch t := int(m.Header.Type); t {
	case unix.NFNL_MSG_BATCH_BEGIN:
		return "BEGIN"
	case unix.NFNL_MSG_BATCH_END:
		return "END"
	default:
		if name, ok := msgNames[t&0xff]; ok && t>>8 == unix.NFNL_SUBSYS_NFTABLES {
			return name
		}
		return fmt.Sprintf("type %#x", t)
	}
}

func msgTypes(batch []netlink.Message) []string {
	out := make([]string, len(batch))
	for i, m := range batch {
		out[i] = msgType(m)
	}
	return out
}

// elementKeys returns the keys of the elements in a NEWSETELEM or DELSETELEM.
func elementKeys(t *testing.T, m netlink.Message) [][]byte {
	t.Helper()
	attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for _, a := range attrs {
		if a.Type&^unix.NLA_F_NESTED != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		els, err := netlink.UnmarshalAttributes(a.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, el := range els {
			fields, err := netlink.UnmarshalAttributes(el.Data)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fields {
				if f.Type&^unix.NLA_F_NESTED == unix.NFTA_SET_ELEM_KEY {
					v, err := netlink.UnmarshalAttributes(f.Data)
					if err != nil {
						t.Fatal(err)
					}
					keys = append(keys, v[0].Data)
				}
			}
		}
	}
	return keys
}

func TestApplyMessages(t *testing.T) {
	small := &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t",
		Sets: []*nftmodel.Set{{Name: "service-ips", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{
			{Key: nlKey("10.96.0.1", 6, 80), Verdict: nlGoto("svc")},
			{Key: nlKey("10.96.0.2", 6, 80), Verdict: nlGoto("svc")},
		}}},
		Chains: []*nftmodel.Chain{
			nlBase("pre", nftmodel.TypeNAT, nftmodel.HookPrerouting, -100, nlRule(nftmodel.VerdictMap{Key: svcKey, Map: "service-ips"})),
			{Name: "svc", Rules: []nftmodel.Rule{nlRule(nftmodel.NumgenGoto{Chains: []string{"ep1", "ep2"}})}},
			{Name: "ep1", Rules: []nftmodel.Rule{nlRule(nftmodel.DNAT{Proto: 6, Addr: ip("10.244.0.1"), Port: 80})}},
			{Name: "ep2", Rules: []nftmodel.Rule{{Exprs: []nftmodel.Expr{nftmodel.DNAT{Proto: 6, Addr: ip("10.244.0.2"), Port: 80}}, Comment: "default/web:http"}}},
		},
	}
	tests := []struct {
		name      string
		rs        *nftmodel.Ruleset
		want      []string
		wantStats nftmodel.Stats
	}{
		{
			name:      "empty table",
			rs:        &nftmodel.Ruleset{Family: nftmodel.IPv6, Table: "t"},
			want:      []string{"BEGIN", "NEWTABLE", "END"},
			wantStats: nftmodel.Stats{Messages: 3},
		},
		{
			name: "sets, then chains, then rules with their anonymous maps, then elements",
			rs:   small,
			want: []string{"BEGIN", "NEWTABLE",
				"NEWSET",
				"NEWCHAIN", "NEWCHAIN", "NEWCHAIN", "NEWCHAIN",
				"NEWRULE",
				"NEWSET", "NEWSETELEM", "NEWRULE",
				"NEWRULE", "NEWRULE",
				"NEWSETELEM",
				"END"},
			wantStats: nftmodel.Stats{Messages: 15, Elements: 4, Rules: 4, Chains: 4, Sets: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, conn := newRecorder(t)
			stats, err := Apply(conn, tt.rs)
			if err != nil {
				t.Fatal(err)
			}
			batch := r.lastBatch()
			if d := gocmp.Diff(tt.want, msgTypes(batch)); d != "" {
				t.Errorf("messages (-want +got):\n%s", d)
			}
			if stats != tt.wantStats {
				t.Errorf("stats = %+v, want %+v", stats, tt.wantStats)
			}
			if stats.Messages != len(batch) {
				t.Errorf("Stats.Messages = %d, batch has %d", stats.Messages, len(batch))
			}
		})
	}
}

func TestApplyChangesSmallBatch(t *testing.T) {
	endpoints := &nftmodel.Set{Name: "endpoints", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}}
	services := &nftmodel.Set{Name: "service-nodeports", Key: []nftmodel.DataType{nftmodel.TypeInetProto, nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}}
	tests := []struct {
		name     string
		changes  nftmodel.Changes
		want     []string
		wantKeys [][]byte // keys of the element messages, in order
	}{
		{
			name: "one endpoint changes its address",
			changes: nftmodel.Changes{
				DelElements: []nftmodel.SetElements{{Set: "endpoints", Elements: []nftmodel.Element{{Key: nlKey("10.96.0.1", 6, 80), Data: []nftmodel.Value{nftmodel.A(ip("10.244.0.1")), nftmodel.N(80)}}}}},
				AddElements: []nftmodel.SetElements{{Set: "endpoints", Elements: []nftmodel.Element{{Key: nlKey("10.96.0.1", 6, 80), Data: []nftmodel.Value{nftmodel.A(ip("10.244.0.9")), nftmodel.N(80)}}}}},
			},
			want: []string{"BEGIN", "DELSETELEM", "NEWSETELEM", "END"},
			wantKeys: [][]byte{
				{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0},
				{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0},
			},
		},
		{
			name: "a node port appears",
			changes: nftmodel.Changes{
				AddElements: []nftmodel.SetElements{{Set: "service-nodeports", Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.N(17), nftmodel.N(30053)}, Verdict: nlGoto("svc")}}}},
			},
			want:     []string{"BEGIN", "NEWSETELEM", "END"},
			wantKeys: [][]byte{{17, 0, 0, 0, 0x75, 0x65, 0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, conn := newRecorder(t, endpoints, services)
			stats, err := ApplyChanges(conn, nftmodel.IPv4, "t", &tt.changes)
			if err != nil {
				t.Fatal(err)
			}
			batch := r.lastBatch()
			if len(batch) > 6 {
				t.Errorf("batch has %d messages, want at most 6", len(batch))
			}
			if d := gocmp.Diff(tt.want, msgTypes(batch)); d != "" {
				t.Errorf("messages (-want +got):\n%s", d)
			}
			var keys [][]byte
			for _, m := range batch {
				keys = append(keys, elementKeys(t, m)...)
			}
			if d := gocmp.Diff(tt.wantKeys, keys); d != "" {
				t.Errorf("element keys (-want +got):\n%s", d)
			}
			if stats.Messages != len(batch) {
				t.Errorf("Stats.Messages = %d, batch has %d", stats.Messages, len(batch))
			}
		})
	}
}

func TestApplyChangesOrder(t *testing.T) {
	endpoints := &nftmodel.Set{Name: "endpoints", Key: vipType, Data: []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}}
	newMap := &nftmodel.Set{Name: "new-map", Key: []nftmodel.DataType{nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict},
		Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.N(80)}, Verdict: nlGoto("new-chain")}}}
	el := []nftmodel.Element{{Key: nlKey("10.96.0.1", 6, 80), Data: []nftmodel.Value{nftmodel.A(ip("10.244.0.1")), nftmodel.N(80)}}}
	c := nftmodel.Changes{
		AddSets:       []*nftmodel.Set{newMap},
		AddChains:     []*nftmodel.Chain{{Name: "new-chain"}},
		DelElements:   []nftmodel.SetElements{{Set: "endpoints", Elements: el}},
		RewriteChains: []*nftmodel.Chain{{Name: "new-chain", Rules: []nftmodel.Rule{nlRule(nftmodel.Verdict{Kind: nftmodel.Accept})}}},
		AddElements:   []nftmodel.SetElements{{Set: "endpoints", Elements: el}},
		DelChains:     []string{"old-a", "old-b"},
		DelSets:       []string{"old-set"},
	}
	r, conn := newRecorder(t, endpoints)
	stats, err := ApplyChanges(conn, nftmodel.IPv4, "t", &c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"BEGIN",
		"NEWSET",             // add sets (their elements come later)
		"NEWCHAIN",           // add chains
		"DELSETELEM",         // delete elements
		"DELRULE", "NEWRULE", // rewrite chains
		"DELRULE", "DELRULE", // empty the chains about to go
		"NEWSETELEM",           // new sets' elements, which name new chains
		"NEWSETELEM",           // add elements
		"DELSET",               // delete sets
		"DELCHAIN", "DELCHAIN", // delete chains
		"END"}
	if d := gocmp.Diff(want, msgTypes(r.lastBatch())); d != "" {
		t.Errorf("messages (-want +got):\n%s", d)
	}
	wantStats := nftmodel.Stats{Messages: len(want), Elements: 3, Rules: 1, Chains: 6, Sets: 2}
	if stats != wantStats {
		t.Errorf("stats = %+v, want %+v", stats, wantStats)
	}
}

func TestApplySplitsLargeSets(t *testing.T) {
	const n = 5000
	r, conn := newRecorder(t)
	stats, err := Apply(conn, bigSetRuleset(n))
	if err != nil {
		t.Fatal(err)
	}
	batch := r.lastBatch()
	var elems, elemMsgs int
	for i, m := range batch {
		if size := len(m.Data) + 16; size > 64<<10 {
			t.Errorf("message %d (%s) is %d bytes", i, msgType(m), size)
		}
		if msgType(m) == "NEWSETELEM" {
			elemMsgs++
			k := len(elementKeys(t, m))
			if k > maxChunkElements {
				t.Errorf("message %d carries %d elements", i, k)
			}
			elems += k
		}
	}
	if elems != n || stats.Elements != n {
		t.Errorf("elements sent %d, Stats.Elements %d, want %d", elems, stats.Elements, n)
	}
	if elemMsgs < n/maxChunkElements {
		t.Errorf("%d element messages, want at least %d", elemMsgs, n/maxChunkElements)
	}
	if stats.Messages != len(batch) {
		t.Errorf("Stats.Messages = %d, batch has %d", stats.Messages, len(batch))
	}
	// Numbered once written: consecutively, so that a refusal names its message.
	for i, m := range batch[1:] {
		if m.Header.Sequence != batch[0].Header.Sequence+uint32(i+1) {
			t.Fatalf("message %d numbered %d after the begin's %d", i+1, m.Header.Sequence, batch[0].Header.Sequence)
		}
	}
}

// A refused element message is named in the error by the elements it
// carried: the batch is numbered as the kernel reads it, after being written.
func TestApplyNamesRefusedElements(t *testing.T) {
	const n = 5000
	r, _ := newRecorder(t)
	var seqs []uint32
	conn := dialConn(t, func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) == 0 || req[0].Header.Type != netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN) {
			return r.dial(req)
		}
		var elems []netlink.Message
		for _, m := range req {
			seqs = append(seqs, m.Header.Sequence)
			if msgType(m) == "NEWSETELEM" {
				elems = append(elems, m)
			}
		}
		return nltest.Error(int(unix.ENOSPC), elems[2:3])
	})
	_, err := Apply(conn, bigSetRuleset(n))
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Apply: %v, want ENOSPC", err)
	}
	// The fixture's comments fill a message's 32 KiB with 390 elements:
	// the third holds elements 780 to 1169.
	want := "add 390 elements of set endpoints (10.96.3.12 . tcp . 80 … 10.96.4.145 . tcp . 80)"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
	if seqs[0] == 0 {
		t.Errorf("batch numbered from 0: not renumbered once written")
	}
}

// A ruleset the applier can't translate is refused before anything is
// queued, so the Conn's next batch is clean.
func TestApplyRefusesBadModelWithoutQueueing(t *testing.T) {
	longComment := string(make([]byte, maxCommentLen+1))
	tests := []struct {
		name string
		rs   *nftmodel.Ruleset
	}{
		{"IPv6 address in an IPv4 table", &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Chains: []*nftmodel.Chain{
			{Name: "c", Rules: []nftmodel.Rule{nlRule(nftmodel.DNAT{Proto: 6, Addr: ip("fd00::1"), Port: 80})}}}}},
		{"IPv4 prefix in an IPv6 table", &nftmodel.Ruleset{Family: nftmodel.IPv6, Table: "t", Chains: []*nftmodel.Chain{
			{Name: "c", Rules: []nftmodel.Rule{nlRule(nftmodel.MatchPrefix{Field: nftmodel.FieldSaddr, Prefix: pfx("10.0.0.0/8")})}}}}},
		{"numgen without chains", &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Chains: []*nftmodel.Chain{
			{Name: "c", Rules: []nftmodel.Rule{nlRule(nftmodel.NumgenGoto{})}}}}},
		{"comment too long", &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Chains: []*nftmodel.Chain{
			{Name: "c", Rules: []nftmodel.Rule{{Exprs: []nftmodel.Expr{nftmodel.Verdict{Kind: nftmodel.Accept}}, Comment: longComment}}}}}},
		{"element with a short key", &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Sets: []*nftmodel.Set{
			{Name: "s", Key: vipType, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(ip("10.0.0.1"))}}}}}}},
		{"verdict map element without verdict", &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Sets: []*nftmodel.Set{
			{Name: "s", Key: []nftmodel.DataType{nftmodel.TypeInetService}, Data: []nftmodel.DataType{nftmodel.TypeVerdict}, Elements: []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.N(80)}}}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, conn := newRecorder(t)
			if _, err := Apply(conn, tt.rs); err == nil {
				t.Fatal("Apply succeeded")
			} else {
				t.Log(err)
			}
			if len(r.batches) != 0 {
				t.Fatalf("a batch was sent: %v", msgTypes(r.lastBatch()))
			}
			if err := Delete(conn, nftmodel.IPv4, "t"); err != nil {
				t.Fatal(err)
			}
			if d := gocmp.Diff([]string{"BEGIN", "NEWTABLE", "DELTABLE", "END"}, msgTypes(r.lastBatch())); d != "" {
				t.Errorf("next batch (-want +got):\n%s", d)
			}
		})
	}
}

func TestReg(t *testing.T) {
	// nft's register names for concatenation parts, as --debug=netlink prints them.
	for _, tt := range []struct{ offset, want uint32 }{
		{0, 1}, {1, 9}, {2, 10}, {3, 11}, {4, 2}, {5, 13}, {8, 3},
	} {
		if got := reg(tt.offset); got != tt.want {
			t.Errorf("reg(%d) = %d, want %d", tt.offset, got, tt.want)
		}
	}
}

func TestModelTypeListInvertsLibTypes(t *testing.T) {
	for _, ts := range [][]nftmodel.DataType{
		{nftmodel.TypeIPv4Addr}, {nftmodel.TypeIPv6Addr}, {nftmodel.TypeInetProto}, {nftmodel.TypeInetService},
		vipType, vip6Type, {nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}, {nftmodel.TypeIPv6Addr, nftmodel.TypeIPv6Addr},
	} {
		lt, err := libTypes(ts)
		if err != nil {
			t.Fatal(err)
		}
		got, err := modelTypeList(lt.GetNFTMagic())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, ts) {
			t.Errorf("modelTypeList(libTypes(%v)) = %v", ts, got)
		}
	}
}

// elementSize must be what google/nftables really encodes, or Stats would
// miscount the messages of anonymous maps, which the library splits itself.
func TestElementSizeMatchesLibrary(t *testing.T) {
	set := &nftables.Set{Table: &nftables.Table{Name: "t"}, Name: "s", IsMap: true}
	for _, el := range []nftables.SetElement{
		{Key: []byte{1, 2, 3, 4}},
		{Key: []byte{1, 2, 3}, Comment: "a comment"},
		{Key: make([]byte, 12), Val: make([]byte, 8), Comment: "x"},
		{Key: make([]byte, 4), VerdictData: verdictExpr(nftmodel.Verdict{Kind: nftmodel.Goto, Chain: "some-chain"})},
		{Key: make([]byte, 4), VerdictData: verdictExpr(nftmodel.Verdict{Kind: nftmodel.Drop})},
	} {
		r, conn := newRecorder(t)
		if err := conn.lib.SetAddElements(set, []nftables.SetElement{el}); err != nil {
			t.Fatal(err)
		}
		if err := conn.lib.Flush(); err != nil {
			t.Fatal(err)
		}
		m := r.lastBatch()[1]
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range attrs {
			if a.Type&^unix.NLA_F_NESTED == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				if got := elementSize(&el); got != len(a.Data) {
					t.Errorf("elementSize(%+v) = %d, library encodes %d", el, got, len(a.Data))
				}
			}
		}
	}
}

// The encoder refuses what the wire can't carry or nft could not list.
func TestElementEncoderCheck(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	bad := []struct {
		key []nftmodel.DataType
		el  nftmodel.Element
	}{
		{[]nftmodel.DataType{nftmodel.TypeIPv4Addr}, nftmodel.Element{Key: []nftmodel.Value{nftmodel.A(v6)}}},
		{[]nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetService}, nftmodel.Element{Key: []nftmodel.Value{nftmodel.A(v4)}}},
		{[]nftmodel.DataType{nftmodel.TypeIPv4Addr}, nftmodel.Element{Key: []nftmodel.Value{nftmodel.A(v4)}, Comment: strings.Repeat("c", maxCommentLen+1)}},
	}
	for _, tt := range bad {
		if err := newElementEncoder(tt.key, nil, false, false).check(&tt.el); err == nil {
			t.Errorf("check(%+v) passed", tt.el)
		}
	}
	if err := newElementEncoder([]nftmodel.DataType{nftmodel.TypeIPv4Addr}, []nftmodel.DataType{nftmodel.TypeVerdict}, true, false).check(&nftmodel.Element{Key: []nftmodel.Value{nftmodel.A(v4)}}); err == nil {
		t.Error("check passed a verdict map element without verdict")
	}
}

// libElement converts a checked element to google/nftables' form, to
// compare the wire encoding with the library's.
func libElement(enc *elementEncoder, e *nftmodel.Element) nftables.SetElement {
	le := nftables.SetElement{Key: nftmodel.KeyBytes(enc.key, e.Key), Comment: e.Comment}
	if enc.interval {
		end := e.KeyEnd
		if end == nil {
			end = e.Key
		}
		le.KeyEnd = nftmodel.KeyBytes(enc.key, end)
	}
	switch {
	case enc.verdicts:
		le.VerdictData = verdictExpr(*e.Verdict)
	case len(enc.data) > 0:
		le.Val = nftmodel.KeyBytes(enc.data, e.Data)
	}
	return le
}

// The applier writes element messages itself; they must be what
// google/nftables would have sent, byte for byte.
func TestWireElementsMatchLibrary(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	concat := []nftmodel.DataType{nftmodel.TypeIPv4Addr, nftmodel.TypeInetProto, nftmodel.TypeInetService}
	tests := []struct {
		name      string
		family    nftmodel.Family
		key, data []nftmodel.DataType
		verdicts  bool
		add       bool
		els       []nftmodel.Element
	}{
		{"verdict map", nftmodel.IPv4, concat, []nftmodel.DataType{nftmodel.TypeVerdict}, true, true, []nftmodel.Element{
			{Key: []nftmodel.Value{nftmodel.A(v4), nftmodel.N(6), nftmodel.N(80)}, Verdict: &nftmodel.Verdict{Kind: nftmodel.Goto, Chain: "service-web"}, Comment: "default/web:http"},
			{Key: []nftmodel.Value{nftmodel.A(v4), nftmodel.N(17), nftmodel.N(53)}, Verdict: &nftmodel.Verdict{Kind: nftmodel.Drop}},
			{Key: []nftmodel.Value{nftmodel.A(v4), nftmodel.N(6), nftmodel.N(443)}, Verdict: &nftmodel.Verdict{Kind: nftmodel.Jump, Chain: "x"}},
			{Key: []nftmodel.Value{nftmodel.A(v4), nftmodel.N(132), nftmodel.N(9)}, Verdict: &nftmodel.Verdict{Kind: nftmodel.Accept}, Comment: "ns/a-much-longer-service-name:with-a-port"},
		}},
		{"data map", nftmodel.IPv6, []nftmodel.DataType{nftmodel.TypeInetService}, []nftmodel.DataType{nftmodel.TypeIPv6Addr, nftmodel.TypeInetService}, false, true, []nftmodel.Element{
			{Key: []nftmodel.Value{nftmodel.N(1)}, Data: []nftmodel.Value{nftmodel.A(v6), nftmodel.N(8080)}},
			{Key: []nftmodel.Value{nftmodel.N(2)}, Data: []nftmodel.Value{nftmodel.A(v6), nftmodel.N(8081)}, Comment: "c"},
		}},
		{"set", nftmodel.IPv4, []nftmodel.DataType{nftmodel.TypeIPv4Addr}, nil, false, true, []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(v4)}}}},
		{"IPv6 set with a comment", nftmodel.IPv6, []nftmodel.DataType{nftmodel.TypeIPv6Addr}, nil, false, true, []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(v6)}, Comment: "default/web:http"}}},
		{"deletion", nftmodel.IPv4, concat, nil, false, false, []nftmodel.Element{{Key: []nftmodel.Value{nftmodel.A(v4), nftmodel.N(6), nftmodel.N(80)}}}},
		{"interval set", nftmodel.IPv4, fwType, nil, false, true, []nftmodel.Element{
			{Key: fwKey(v4, "192.168.0.0"), KeyEnd: fwKey(v4, "192.168.255.255"), Comment: "default/web:http"},
			{Key: fwKey(v4, "10.96.0.1")},
		}},
		{"interval deletion", nftmodel.IPv4, fwType, nil, false, false, []nftmodel.Element{
			{Key: fwKey(v4, "192.168.0.0"), KeyEnd: fwKey(v4, "192.168.255.255")},
		}},
	}
	// The interval cases' set holds ranges.
	interval := map[string]bool{"interval set": true, "interval deletion": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := &nftables.Table{Name: "nftproxy", Family: libFamily(tt.family)}
			s := &nftmodel.Set{Name: "s", Key: tt.key, Interval: interval[tt.name]}
			if tt.add {
				s.Data = tt.data
			}
			ls, err := libSet(table, s)
			if err != nil {
				t.Fatal(err)
			}
			ls.ID = 7
			enc := newElementEncoder(tt.key, s.Data, tt.verdicts, s.Interval)
			lels := make([]nftables.SetElement, len(tt.els))
			for i := range tt.els {
				if err := enc.check(&tt.els[i]); err != nil {
					t.Fatal(err)
				}
				lels[i] = libElement(enc, &tt.els[i])
			}
			r, conn := newRecorder(t)
			call := conn.lib.SetAddElements
			if !tt.add {
				call = conn.lib.SetDeleteElements
			}
			if err := call(ls, lels); err != nil {
				t.Fatal(err)
			}
			if err := conn.lib.Flush(); err != nil {
				t.Fatal(err)
			}
			want := r.lastBatch()[1]

			w := &wire{}
			step := &elementsStep{set: ls, enc: enc, src: listSource(tt.els), add: tt.add}
			var chunks [][2]int
			if err := w.elements(tt.family, table.Name, step, func(lo, hi int) { chunks = append(chunks, [2]int{lo, hi}) }); err != nil {
				t.Fatal(err)
			}
			if want := [][2]int{{0, len(tt.els)}}; !slices.Equal(chunks, want) {
				t.Errorf("chunks %v, want %v", chunks, want)
			}
			got, err := splitMessages(w.buf)
			if err != nil || len(got) != 1 {
				t.Fatalf("split %d bytes: %v, %d messages", len(w.buf), err, len(got))
			}
			if got[0].Header.Type != want.Header.Type || got[0].Header.Flags != want.Header.Flags {
				t.Errorf("header %+v, library %+v", got[0].Header, want.Header)
			}
			if !slices.Equal(got[0].Data, want.Data) {
				t.Errorf("data differs from the library's:\n got %x\nwant %x", got[0].Data, want.Data)
			}
		})
	}
}

// Only errors answering this batch's messages count: acknowledgements,
// echoed rules and errors left over from another batch do not.
func TestFirstRefusal(t *testing.T) {
	reply := func(typ netlink.HeaderType, seq uint32, code int32) netlink.Message {
		data := binary.NativeEndian.AppendUint32(nil, uint32(code))
		return netlink.Message{Header: netlink.Header{Length: uint32(16 + len(data)), Type: typ, Sequence: seq}, Data: data}
	}
	newRule := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE)
	tests := []struct {
		name    string
		replies []netlink.Message
		want    *refusal
	}{
		{"none", nil, nil},
		{"acks and echoes", []netlink.Message{reply(netlink.Error, 101, 0), reply(newRule, 102, 0)}, nil},
		{"another batch's", []netlink.Message{reply(netlink.Error, 99, -int32(unix.ENOENT)), reply(netlink.Error, 110, -int32(unix.EEXIST))}, nil},
		{"first of two", []netlink.Message{reply(netlink.Error, 99, -int32(unix.ENOENT)), reply(netlink.Error, 103, -int32(unix.ENOENT)),
			reply(netlink.Error, 104, -int32(unix.EBUSY))}, &refusal{seq: 103, errno: unix.ENOENT}},
	}
	for _, tt := range tests {
		// The batch: 10 messages numbered from 100.
		if got := firstRefusal(tt.replies, 100, 10); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: firstRefusal = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	// What the kernel sends back splits into the same messages.
	var buf []byte
	for _, m := range tests[3].replies {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		buf = append(buf, b...)
	}
	got, err := splitMessages(buf)
	if err != nil || len(got) != 3 || got[1].Header.Sequence != 103 || !slices.Equal(got[2].Data, tests[3].replies[2].Data) {
		t.Errorf("splitMessages = %+v, %v", got, err)
	}
}
