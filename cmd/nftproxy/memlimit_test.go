package main

import "testing"

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
