package nftmodel_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/modeltest"
)

// Every type switch over Expr (render, trace here; the netlink encoder and
// reader in nftnl) is tested with modeltest.Exprs. This test keeps that list
// whole: it finds the types of this package that implement Expr (the ones
// with an isExpr method) in the source, and wants an example of each.
func TestExamplesCoverEveryExpr(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "isExpr" || fn.Recv == nil {
				continue
			}
			if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok {
				types = append(types, id.Name)
			}
		}
	}
	if len(types) == 0 {
		t.Fatal("found no isExpr methods")
	}
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		var have []string
		for _, e := range modeltest.Exprs(f) {
			have = append(have, reflect.TypeOf(e).Name())
		}
		for _, typ := range types {
			if !slices.Contains(have, typ) {
				t.Errorf("%s: modeltest.Exprs has no %s: add an example, and the type to every switch its tests then fail for", f, typ)
			}
		}
	}
}

// exprPanic runs fn and returns what it panicked with, if anything.
func exprPanic(fn func()) (r any) {
	defer func() { r = recover() }()
	fn()
	return nil
}

func TestRenderEveryExpr(t *testing.T) {
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		for _, e := range modeltest.Exprs(f) {
			var text string
			if r := exprPanic(func() { text = nftmodel.RenderRule(f, nftmodel.Rule{Exprs: []nftmodel.Expr{e}}) }); r != nil || text == "" {
				t.Errorf("%s: render %#v: %q, panic %v", f, e, text, r)
			}
		}
	}
}

func TestTraceEveryExpr(t *testing.T) {
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		p := nftmodel.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.96.0.10"), Proto: 6, SrcPort: 40000, DstPort: 80, Iif: "eth0"}
		if f == nftmodel.IPv6 {
			p.Src, p.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::10")
		}
		for _, e := range modeltest.Exprs(f) {
			rs := modeltest.Ruleset(f, e)
			if r := exprPanic(func() { nftmodel.Trace(rs, p) }); r != nil {
				t.Errorf("%s: trace %#v: %v", f, e, fmt.Sprint(r))
			}
		}
	}
}
