package netns

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

var probe struct {
	once   sync.Once
	reason string
}

// Usable reports why namespaces can't be made here ("" when they can). The
// probe runs once per process.
func Usable() string {
	probe.once.Do(func() {
		if os.Geteuid() != 0 {
			probe.reason = "needs root to create network namespaces (run as root or via make test)"
			return
		}
		if _, err := exec.LookPath("ip"); err != nil {
			probe.reason = "needs iproute2's ip command: " + err.Error()
			return
		}
		n, err := Create("npprobe")
		if err != nil {
			probe.reason = "cannot create a network namespace: " + err.Error()
			return
		}
		if err := n.Close(); err != nil {
			probe.reason = "cannot delete a network namespace: " + err.Error()
		}
	})
	return probe.reason
}

// Require skips the test in -short mode, before anything touches the
// kernel, and when network namespaces can't be made here. Every test that
// needs root or the kernel goes through it (New and NewTopology call it), so
// `go test -short ./...` run as root makes no namespace.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: needs root and network namespaces, which -short leaves out")
	}
	if reason := Usable(); reason != "" {
		t.Skip(reason)
	}
}

// New is Require + Create, with Close registered in t.Cleanup.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	Require(t)
	n, err := Create(prefix)
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close netns: %v", err)
		}
	})
	return n
}
