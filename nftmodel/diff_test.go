package nftmodel

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func vip(addr string, port uint32) []Value {
	return []Value{A(netip.MustParseAddr(addr)), N(6), N(port)}
}

// testRuleset is a small ruleset shaped like the proxier's: a dispatch map, a
// data map per slot, and chains.
func testRuleset(mutate ...func(*Ruleset)) *Ruleset {
	vipT := []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}
	rs := &Ruleset{Family: IPv4, Table: "t",
		Sets: []*Set{
			{Name: "service-ips", Key: vipT, Data: []DataType{TypeVerdict}, Elements: []Element{
				{Key: vip("10.96.0.10", 80), Comment: "default/a:http", Verdict: &Verdict{Kind: Goto, Chain: "pick-2"}},
				{Key: vip("10.96.0.11", 80), Comment: "default/b:http", Verdict: &Verdict{Kind: Goto, Chain: "pick-2"}},
			}},
			{Name: "endpoint-0", Key: vipT, Data: []DataType{TypeIPv4Addr, TypeInetService}, Elements: []Element{
				{Key: vip("10.96.0.10", 80), Data: []Value{A(netip.MustParseAddr("10.244.1.10")), N(8080)}},
				{Key: vip("10.96.0.11", 80), Data: []Value{A(netip.MustParseAddr("10.244.1.20")), N(8080)}},
			}},
		},
		Chains: []*Chain{
			{Name: "prerouting", Base: &BaseChain{Type: TypeNAT, Hook: HookPrerouting, Priority: -100},
				Rules: []Rule{{Exprs: []Expr{VerdictMap{Key: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Map: "service-ips"}}}}},
			{Name: "pick-2", Rules: []Rule{{Exprs: []Expr{NumgenGoto{Chains: []string{"endpoint-0", "endpoint-0"}}}}}},
			{Name: "endpoint-0", Rules: []Rule{{Exprs: []Expr{DNATMap{Key: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Map: "endpoint-0"}}}}},
		},
	}
	for _, f := range mutate {
		f(rs)
	}
	return rs
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name    string
		desired *Ruleset
		want    Changes
	}{
		{name: "no-op sync is empty", desired: testRuleset()},
		{
			name: "endpoint changed",
			desired: testRuleset(func(rs *Ruleset) {
				rs.Sets[1].Elements[0].Data = []Value{A(netip.MustParseAddr("10.244.1.99")), N(8080)}
			}),
			want: Changes{
				DelElements: []SetElements{{Set: "endpoint-0", Elements: testRuleset().Sets[1].Elements[:1]}},
				AddElements: []SetElements{{Set: "endpoint-0", Elements: []Element{{Key: vip("10.96.0.10", 80),
					Data: []Value{A(netip.MustParseAddr("10.244.1.99")), N(8080)}}}}},
			},
		},
		{
			name: "service removed",
			desired: testRuleset(func(rs *Ruleset) {
				rs.Sets[0].Elements = rs.Sets[0].Elements[:1]
				rs.Sets[1].Elements = rs.Sets[1].Elements[:1]
			}),
			want: Changes{DelElements: []SetElements{
				{Set: "service-ips", Elements: testRuleset().Sets[0].Elements[1:]},
				{Set: "endpoint-0", Elements: testRuleset().Sets[1].Elements[1:]},
			}},
		},
		{
			name: "service added with a new chain",
			desired: testRuleset(func(rs *Ruleset) {
				rs.Sets[0].Elements = append(rs.Sets[0].Elements, Element{Key: vip("10.96.0.12", 80),
					Verdict: &Verdict{Kind: Goto, Chain: "endpoint-0"}})
				rs.Chains = append(rs.Chains, &Chain{Name: "extra", Rules: []Rule{{Exprs: []Expr{Verdict{Kind: Drop}}}}})
			}),
			want: Changes{
				AddChains:     []*Chain{{Name: "extra", Rules: []Rule{{Exprs: []Expr{Verdict{Kind: Drop}}}}}},
				RewriteChains: []*Chain{{Name: "extra", Rules: []Rule{{Exprs: []Expr{Verdict{Kind: Drop}}}}}},
				AddElements: []SetElements{{Set: "service-ips", Elements: []Element{{Key: vip("10.96.0.12", 80),
					Verdict: &Verdict{Kind: Goto, Chain: "endpoint-0"}}}}},
			},
		},
		{
			name:    "chain and set removed",
			desired: testRuleset(func(rs *Ruleset) { rs.Chains = rs.Chains[:2]; rs.Sets = rs.Sets[:1] }),
			want:    Changes{DelChains: []string{"endpoint-0"}, DelSets: []string{"endpoint-0"}},
		},
		{
			name: "rule changed",
			desired: testRuleset(func(rs *Ruleset) {
				rs.Chains[1].Rules[0] = Rule{Exprs: []Expr{Verdict{Kind: Goto, Chain: "endpoint-0"}}}
			}),
			want: Changes{RewriteChains: []*Chain{{Name: "pick-2", Rules: []Rule{{Exprs: []Expr{Verdict{Kind: Goto, Chain: "endpoint-0"}}}}}}},
		},
		{
			name:    "comment change replaces the element",
			desired: testRuleset(func(rs *Ruleset) { rs.Sets[0].Elements[0].Comment = "other" }),
			want: Changes{
				DelElements: []SetElements{{Set: "service-ips", Elements: testRuleset().Sets[0].Elements[:1]}},
				AddElements: []SetElements{{Set: "service-ips", Elements: []Element{{Key: vip("10.96.0.10", 80),
					Comment: "other", Verdict: &Verdict{Kind: Goto, Chain: "pick-2"}}}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Diff(testRuleset(), tt.desired)
			if !ok {
				t.Fatal("Diff reported the change as not incremental")
			}
			// Set types are checked once below, not in every case.
			ignoreTypes := cmpopts.IgnoreFields(SetElements{}, "Key", "Data", "Timeout")
			if diff := gocmp.Diff(tt.want, got, cmpopts.EquateEmpty(), ignoreTypes, gocmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("Diff (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiffCarriesSetTypes(t *testing.T) {
	desired := testRuleset(func(rs *Ruleset) { rs.Sets[1].Elements = rs.Sets[1].Elements[:1] })
	got, _ := Diff(testRuleset(), desired)
	if len(got.DelElements) != 1 || !slices.Equal(got.DelElements[0].Key, desired.Sets[1].Key) ||
		!slices.Equal(got.DelElements[0].Data, desired.Sets[1].Data) {
		t.Errorf("DelElements = %+v, want the types of set endpoint-0", got.DelElements)
	}
}

// An interval set's element whose end moves is deleted and added again (the
// kernel can't change it in place), with the set's Interval carried along;
// an interval set that loses its flag is not incremental.
func TestDiffIntervalElements(t *testing.T) {
	a := func(x string) Value { return A(netip.MustParseAddr(x)) }
	key := func(c string) []Value { return []Value{a("192.0.2.1"), N(6), N(80), a(c)} }
	set := func(end string) *Ruleset {
		return &Ruleset{Family: IPv4, Table: "t", Sets: []*Set{{Name: "allow", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService, TypeIPv4Addr}, Interval: true,
			Elements: []Element{{Key: key("10.0.0.0"), KeyEnd: key(end)}, {Key: key("192.0.2.1")}}}}}
	}
	got, ok := Diff(set("10.255.255.255"), set("10.0.255.255"))
	if !ok || len(got.DelElements) != 1 || len(got.AddElements) != 1 || !got.DelElements[0].Interval ||
		len(got.DelElements[0].Elements) != 1 || got.AddElements[0].Elements[0].KeyEnd[3] != a("10.0.255.255") {
		t.Errorf("Diff = %+v, %v; want the range deleted and added with its new end", got, ok)
	}
	if got, _ := Diff(set("10.255.255.255"), set("10.255.255.255")); !got.Empty() {
		t.Errorf("Diff of equal sets = %+v", got)
	}
	plain := set("10.255.255.255")
	plain.Sets[0].Interval = false
	if _, ok := Diff(set("10.255.255.255"), plain); ok {
		t.Error("Diff: a set losing its interval flag is incremental")
	}
}

func TestDiffNotIncremental(t *testing.T) {
	tests := map[string]*Ruleset{
		"set type changed":   testRuleset(func(rs *Ruleset) { rs.Sets[1].Data = []DataType{TypeIPv4Addr} }),
		"set size changed":   testRuleset(func(rs *Ruleset) { rs.Sets[1].Size = 8192 }),
		"base chain changed": testRuleset(func(rs *Ruleset) { rs.Chains[0].Base = &BaseChain{Type: TypeNAT, Hook: HookOutput} }),
		"other table":        testRuleset(func(rs *Ruleset) { rs.Table = "other" }),
	}
	for name, desired := range tests {
		if _, ok := Diff(testRuleset(), desired); ok {
			t.Errorf("%s: Diff should ask for a full apply", name)
		}
	}
}

func TestRenderSortsLikeNft(t *testing.T) {
	// Order measured with nft 1.0.6: concatenations compare from the last byte.
	s := &Set{Name: "s", Key: []DataType{TypeInetProto, TypeInetService}}
	for _, p := range []struct{ proto, port uint32 }{{6, 80}, {17, 80}, {6, 256}, {6, 1}, {6, 30080}, {132, 5}, {17, 53}} {
		s.Elements = append(s.Elements, Element{Key: []Value{N(p.proto), N(p.port)}})
	}
	var got []string
	for _, e := range SortedElements(s) {
		got = append(got, renderElement(s, e))
	}
	want := []string{"tcp . 256", "tcp . 1", "sctp . 5", "udp . 53", "tcp . 80", "udp . 80", "tcp . 30080"}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("element order (-want +got):\n%s", diff)
	}
}

// An interval set's element prints each part as nft lists it: one value,
// a prefix, or a range.
func TestRenderRange(t *testing.T) {
	s := &Set{Name: "s", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService, TypeIPv4Addr}, Interval: true}
	a := func(x string) Value { return A(netip.MustParseAddr(x)) }
	key := func(c string) []Value { return []Value{a("192.0.2.1"), N(6), N(80), a(c)} }
	tests := []struct {
		el   Element
		want string
	}{
		{Element{Key: key("10.0.0.1")}, "192.0.2.1 . tcp . 80 . 10.0.0.1"},
		{Element{Key: key("10.0.0.0"), KeyEnd: key("10.255.255.255")}, "192.0.2.1 . tcp . 80 . 10.0.0.0/8"},
		{Element{Key: key("0.0.0.0"), KeyEnd: key("255.255.255.255")}, "192.0.2.1 . tcp . 80 . 0.0.0.0/0"},
		{Element{Key: key("10.0.0.1"), KeyEnd: key("10.0.0.9")}, "192.0.2.1 . tcp . 80 . 10.0.0.1-10.0.0.9"},
		{Element{Key: key("10.0.0.0"), KeyEnd: []Value{a("192.0.2.1"), N(6), N(90), a("10.0.0.0")}}, "192.0.2.1 . tcp . 80-90 . 10.0.0.0"},
	}
	for _, tt := range tests {
		if got := renderElement(s, tt.el); got != tt.want {
			t.Errorf("renderElement = %q, want %q", got, tt.want)
		}
	}
	p := netip.MustParsePrefix("fd00:1::/64")
	if got, ok := RangePrefix(p.Addr(), LastAddr(p)); !ok || got != p {
		t.Errorf("RangePrefix(%v) = %v, %v", p, got, ok)
	}
}

// SortElements sorts in place what a plain stable sort on the listing-order
// keys would, duplicates keeping their order.
func TestSortElements(t *testing.T) {
	listingKey := func(types []DataType, vals []Value) string {
		k := KeyBytes(types, vals)
		if len(types) > 1 {
			slices.Reverse(k)
		}
		return string(k)
	}
	concat := []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}
	single := []DataType{TypeInetService}
	for _, types := range [][]DataType{concat, single} {
		var els []Element
		for i := range 300 {
			// Few distinct keys, so many duplicates; Comment tells them apart.
			a := netip.AddrFrom4([4]byte{10, 96, byte(i * 7 % 3), byte(i * 13 % 5)})
			key := []Value{N(uint32(i * 31 % 7))}
			if len(types) > 1 {
				key = []Value{A(a), N(uint32(6 + i%2*11)), N(uint32(i * 31 % 7))}
			}
			els = append(els, Element{Key: key, Comment: string(rune('a' + i%26))})
		}
		want := slices.Clone(els)
		slices.SortStableFunc(want, func(a, b Element) int {
			return strings.Compare(listingKey(types, a.Key), listingKey(types, b.Key))
		})
		s := &Set{Name: "s", Key: types, Elements: slices.Clone(els)}
		if got := SortedElements(s); !gocmp.Equal(got, want, gocmp.Comparer(func(a, b netip.Addr) bool { return a == b })) {
			t.Errorf("SortedElements of %v keys differs from a stable sort", types)
		}
		if !gocmp.Equal(s.Elements, els, gocmp.Comparer(func(a, b netip.Addr) bool { return a == b })) {
			t.Error("SortedElements changed the set")
		}
		SortElements(s)
		if !gocmp.Equal(s.Elements, want, gocmp.Comparer(func(a, b netip.Addr) bool { return a == b })) {
			t.Errorf("SortElements of %v keys differs from a stable sort", types)
		}
	}
}
