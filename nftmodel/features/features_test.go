package features

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestClassify(t *testing.T) {
	f := &Feature{Name: "numgen random", MinKernel: "4.9"}
	tests := []struct {
		err         error
		unsupported bool
	}{
		{nil, false},
		{fmt.Errorf("add rule ip: %w", unix.ENOENT), true},
		{fmt.Errorf("add rule ip: %w", unix.EOPNOTSUPP), true},
		{fmt.Errorf("add set ip: %w", unix.EINVAL), true},
		{fmt.Errorf("no notification: %w", errMissing), true},
		{fmt.Errorf("send: %w", unix.EPERM), false},
		{fmt.Errorf("receive: %w", unix.ENOBUFS), false},
	}
	for _, tt := range tests {
		got := classify(f, tt.err)
		if tt.err == nil {
			if got != nil {
				t.Errorf("classify(nil) = %v", got)
			}
			continue
		}
		if errors.Is(got, ErrNotSupported) != tt.unsupported {
			t.Errorf("classify(%v) = %v, unsupported = %v, want %v", tt.err, got, !tt.unsupported, tt.unsupported)
		}
		if !errors.Is(got, tt.err) {
			t.Errorf("classify(%v) = %v does not wrap the kernel's answer", tt.err, got)
		}
		if !strings.Contains(got.Error(), f.Name) || strings.Contains(got.Error(), "\n") {
			t.Errorf("classify(%v) = %q, want one line naming the feature", tt.err, got)
		}
	}
	want := "kernel lacks numgen random (needs Linux 4.9 or later): add rule ip: no such file or directory"
	if got := classify(f, fmt.Errorf("add rule ip: %w", unix.ENOENT)).Error(); got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

// Each feature is probed once per Prober; Check stops at the first missing
// feature.
func TestProbeRunsOnceAndChecksInOrder(t *testing.T) {
	runs := map[string]int{}
	feature := func(name string, err error) *Feature {
		return &Feature{Name: name, MinKernel: "1.0", run: func(*Prober) error { runs[name]++; return err }}
	}
	a, b, c := feature("a", nil), feature("b", unix.EOPNOTSUPP), feature("c", nil)
	p := NewProber(0)
	for range 3 {
		err := p.Check(a, b, c)
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "kernel lacks b") {
			t.Fatalf("Check() = %v, want b unsupported", err)
		}
	}
	if runs["a"] != 1 || runs["b"] != 1 || runs["c"] != 0 {
		t.Errorf("probe runs %v, want a and b once, c never", runs)
	}
}

// The daemon's list holds every nftables feature, each with a minimum kernel.
func TestRulesetFeaturesDescribed(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range Ruleset() {
		if f.Name == "" || f.MinKernel == "" || (f.program == nil) == (f.run == nil) || seen[f.Name] {
			t.Errorf("feature %+v: want a unique name, a minimum kernel and one probe", f)
		}
		seen[f.Name] = true
	}
}
