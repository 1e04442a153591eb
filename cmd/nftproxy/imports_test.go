package main

import (
	"go/parser"
	"go/token"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// `nftproxy dump` and `explain` compile and trace without a kernel: nothing
// dump.go and explain.go import, directly or not, talks to it (the rest of
// the binary does, through nftmodel/nftnl and conntrack).
func TestDumpExplainImportNoKernel(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: no go tool on PATH to list the imports")
	}
	var pkgs []string
	for _, file := range []string{"dump.go", "explain.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			pkgs = append(pkgs, path)
		}
	}
	out, err := exec.Command(goTool, append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", strings.Join(pkgs, " "), err)
	}
	kernel := []string{
		"github.com/google/nftables",
		"github.com/mdlayher/netlink",
		"github.com/ti-mo/",
		"github.com/nftproxy/nftproxy/nftmodel/nftnl",
		"github.com/nftproxy/nftproxy/conntrack",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, k := range kernel {
			if strings.HasPrefix(dep, k) {
				t.Errorf("dump.go or explain.go imports %s", dep)
			}
		}
	}
}
