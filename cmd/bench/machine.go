package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine describes where the numbers come from.
type Machine struct {
	CPU      string            `json:"cpu"`
	CPUs     int               `json:"cpus"`
	MemoryMi int               `json:"memory_mib"`
	Kernel   string            `json:"kernel"`
	OS       string            `json:"os"`
	Go       string            `json:"go"`
	Tools    map[string]string `json:"tools"`
	Nftables string            `json:"google_nftables"`
}

// benchTools are the programs the phases run, each with the flag that makes it
// print its version.
var benchTools = [][2]string{{"nft", "--version"}, {"iptables-legacy-restore", "--version"}, {"iptables-nft-restore", "--version"}, {"ip", "-V"}}

func describeMachine() (Machine, error) {
	mc := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: map[string]string{}}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return mc, fmt.Errorf("uname: %w", err)
	}
	mc.Kernel = unix.ByteSliceToString(uts.Release[:])
	mc.CPU = procField("/proc/cpuinfo", "model name")
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		mc.MemoryMi = int(si.Totalram * uint64(si.Unit) >> 20)
	}
	mc.OS = strings.Trim(procField("/etc/os-release", "PRETTY_NAME"), `"`)
	for _, tool := range benchTools {
		out, err := exec.Command(tool[0], tool[1]).CombinedOutput()
		if err != nil {
			return mc, fmt.Errorf("find %s (install nftables, iptables and iproute2): %w", tool[0], err)
		}
		mc.Tools[tool[0]] = strings.TrimSpace(string(out))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/google/nftables" {
				mc.Nftables = d.Version
			}
		}
	}
	return mc, nil
}

// procField returns the value of the first "key: value" or "key=value" line.
func procField(path, key string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			k, v, ok = strings.Cut(line, "=")
		}
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAverage returns the 1, 5 and 15 minute load averages: other work on
// the machine shows in the timings.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
