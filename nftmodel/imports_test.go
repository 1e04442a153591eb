package nftmodel

import (
	"os/exec"
	"strings"
	"testing"
)

// kernelPackages are the import paths, by prefix, of what talks to the
// kernel: the netlink libraries and nftproxy's own writer (nftnl).
var kernelPackages = []string{
	"github.com/google/nftables",
	"github.com/mdlayher/netlink",
	"github.com/ti-mo/",
	"github.com/nftproxy/nftproxy/nftmodel/nftnl",
	"github.com/nftproxy/nftproxy/conntrack",
}

// The model is pure: nothing it imports, directly or not, talks to the
// kernel, so the renderer, diff and tracer build and run anywhere.
func TestModelImportsNoKernel(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: no go tool on PATH to list the imports")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, k := range kernelPackages {
			if strings.HasPrefix(dep, k) {
				t.Errorf("nftmodel imports %s", dep)
			}
		}
	}
}

// google/nftables, pinned to a pseudo-version and used through its test
// hook, stays behind nftnl: no other package of the module imports it, not
// even in its tests.
func TestOnlyNftnlImportsTheLibrary(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("skipping: no go tool on PATH to list the imports")
	}
	out, err := exec.Command(goTool, "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "github.com/nftproxy/nftproxy/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		if pkg == "github.com/nftproxy/nftproxy/nftmodel/nftnl" {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, "github.com/google/nftables") {
				t.Errorf("%s imports %s", pkg, imp)
			}
		}
	}
}
