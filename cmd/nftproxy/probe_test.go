package main

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/features"
)

// stubProbe replaces the kernel probe for one test.
func stubProbe(t *testing.T, probe func(int, []nftmodel.Family, bool) error) {
	t.Helper()
	saved := probeKernel
	probeKernel = probe
	t.Cleanup(func() { probeKernel = saved })
}

// A kernel without a feature the ruleset needs: run refuses with one line
// naming it and its minimum kernel, before it binds, writes or programs
// anything (the servers' ports would be taken otherwise: this needs no root).
func TestRunRefusesAKernelWithoutAFeature(t *testing.T) {
	var gotFams []nftmodel.Family
	var gotConntrack bool
	stubProbe(t, func(_ int, fams []nftmodel.Family, conntrack bool) error {
		gotFams, gotConntrack = fams, conntrack
		return &features.UnsupportedError{Feature: features.Numgen.Name, MinKernel: features.Numgen.MinKernel,
			Err: unix.ENOENT}
	})
	err := run([]string{"run", "--manifests", "../../deploy/examples", "--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56",
		"--healthz-bind-address", "127.0.0.1:1", "--metrics-bind-address", "127.0.0.1:1"})
	if err == nil {
		t.Fatal("run started on a kernel without numgen")
	}
	for _, part := range []string{"numgen random", "Linux 4.9"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("reason %q does not say %q", err, part)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("reason %q is not one line", err)
	}
	if len(gotFams) != 2 || gotFams[0] != nftmodel.IPv4 || gotFams[1] != nftmodel.IPv6 || !gotConntrack {
		t.Errorf("probed families %v, conntrack %v; want ip and ip6, and conntrack (on by default)", gotFams, gotConntrack)
	}
}

// dump and explain touch no kernel: they don't probe it either.
func TestDumpAndExplainDoNotProbe(t *testing.T) {
	stubProbe(t, func(int, []nftmodel.Family, bool) error {
		t.Error("the kernel was probed")
		return nil
	})
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	saved := os.Stdout
	os.Stdout = devnull
	defer func() { os.Stdout = saved }()
	for _, args := range [][]string{
		{"dump", "--manifests", "../../deploy/examples"},
		{"explain", "--manifests", "../../deploy/examples", "--dst", "10.96.0.10", "--port", "53", "--proto", "udp"},
	} {
		if err := run(args); err != nil {
			t.Errorf("nftproxy %v: %v", args, err)
		}
	}
}
