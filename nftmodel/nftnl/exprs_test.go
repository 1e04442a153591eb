package nftnl

import (
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/modeltest"
)

// Every expression type encodes (ruleExprs' switch), and the reader decodes
// what was encoded back into the same expression. (modeltest's own test in
// nftmodel keeps its examples covering every type.)
func TestEncodeAndReadEveryExpr(t *testing.T) {
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		for _, e := range modeltest.Exprs(f) {
			r := nftmodel.Rule{Exprs: []nftmodel.Expr{e}}
			encoded, _, err := ruleExprs(f, r)
			if err != nil {
				t.Errorf("%s: encode %#v: %v", f, e, err)
				continue
			}
			if _, ok := e.(nftmodel.NumgenGoto); ok {
				continue // its anonymous map is read from the kernel: TestDifferential
			}
			// As the kernel gives it back: google/nftables doesn't decode a
			// byte order conversion.
			kernel := slices.DeleteFunc(slices.Clone(encoded), func(x expr.Any) bool {
				_, ok := x.(*expr.Byteorder)
				return ok
			})
			got, err := readRule(nil, f, &nftables.Rule{Exprs: kernel}, nil)
			if err != nil {
				t.Errorf("%s: read %q back: %v", f, nftmodel.RenderRule(f, r), err)
				continue
			}
			if diff := cmp.Diff(r, got, cmp.Comparer(func(a, b nftmodel.Expr) bool { return reflect.DeepEqual(a, b) })); diff != "" {
				t.Errorf("%s: %q read back differently (-want +got):\n%s", f, nftmodel.RenderRule(f, r), diff)
			}
		}
	}
}

// The kernel tests' fixtures use every expression type in each family, so
// that TestDifferential checks each against nft's listing and Read.
func TestFixturesUseEveryExpr(t *testing.T) {
	for _, rs := range []*nftmodel.Ruleset{fullRuleset(), full6Ruleset()} {
		used := map[reflect.Type]bool{}
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				for _, e := range r.Exprs {
					used[reflect.TypeOf(e)] = true
				}
			}
		}
		for _, e := range modeltest.Exprs(rs.Family) {
			if typ := reflect.TypeOf(e); !used[typ] {
				t.Errorf("%s fixture has no %s", rs.Family, typ)
				used[typ] = true // once
			}
		}
	}
}
