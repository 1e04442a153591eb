package main

import (
	"errors"
	"runtime/debug"
	"testing"

	"go.uber.org/zap"
)

func TestSoftLimit(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"max\n", 0, false},
		{"536870912\n", 483183820, false},
		{"1000", 900, false},
		{"", 0, true},
		{"-1", 0, true},
		{"12k", 0, true},
	}
	for _, tt := range tests {
		got, err := softLimit(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("softLimit(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestLeanLoad: the load runs with the collector at loadGCPercent and the
// previous setting comes back after it, error or not; GOGC set by the
// operator is left alone.
func TestLeanLoad(t *testing.T) {
	for _, gogc := range []string{"", "150"} {
		t.Setenv("GOGC", gogc)
		prev := debug.SetGCPercent(80)
		var during int
		err := leanLoad(zap.NewNop(), func() error {
			// Read by setting it and putting it back.
			during = debug.SetGCPercent(100)
			debug.SetGCPercent(during)
			return errors.New("boom")
		})
		if err == nil || err.Error() != "boom" {
			t.Errorf("GOGC=%q: err %v, want the load's", gogc, err)
		}
		want := loadGCPercent
		if gogc != "" {
			want = 80
		}
		if during != want {
			t.Errorf("GOGC=%q: collector at %d%% during the load, want %d%%", gogc, during, want)
		}
		if after := debug.SetGCPercent(prev); after != 80 {
			t.Errorf("GOGC=%q: collector at %d%% after the load, want 80%% back", gogc, after)
		}
	}
}
