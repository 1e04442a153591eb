package main

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// GoBench is one line of `go test -bench` output.
type GoBench struct {
	Name        string  `json:"name"`
	NsPerOp     float64 `json:"ns_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	AllocsPerOp float64 `json:"allocs_per_op"`
}

// goBenchPhase runs the proxier's Go benchmarks (compile and diff at 10,000
// and 50,000 services) a few iterations each and keeps their figures.
func goBenchPhase(res *Results, _ *options) error {
	logf("go test -bench ./proxier/")
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", "3x", "./proxier/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("run go benchmarks: %w: %s", err, firstLines(string(out), 10))
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		b := GoBench{Name: f[0]}
		units := map[string]*float64{"ns/op": &b.NsPerOp, "B/op": &b.BytesPerOp, "allocs/op": &b.AllocsPerOp}
		// Benchmark lines are name, iterations, then value-unit pairs.
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil && units[f[i+1]] != nil {
				*units[f[i+1]] = v
			}
		}
		res.GoBench = append(res.GoBench, b)
	}
	return nil
}
