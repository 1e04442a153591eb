package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// sysctl is one kernel setting the daemon makes at start-up.
type sysctl struct {
	name  string // path under /proc/sys
	value int
	// raiseOnly leaves a larger value in place (nf_conntrack_max).
	raiseOnly bool
}

// conntrackSysctls are the settings kube-proxy makes for its conntrack
// section: nf_conntrack_max from maxPerCore and min (maxPerCore 0 leaves
// it), the timeouts that are not 0, and tcp_be_liberal when asked.
func conntrackSysctls(ct conntrackTuning, cpus int) []sysctl {
	var out []sysctl
	if ct.maxPerCore > 0 {
		out = append(out, sysctl{name: "net/netfilter/nf_conntrack_max", value: max(ct.maxPerCore*cpus, ct.min), raiseOnly: true})
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"net/netfilter/nf_conntrack_tcp_timeout_established", ct.tcpEstablished},
		{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", ct.tcpCloseWait},
		{"net/netfilter/nf_conntrack_udp_timeout", ct.udpTimeout},
		{"net/netfilter/nf_conntrack_udp_timeout_stream", ct.udpStream},
	} {
		if t.d > 0 {
			out = append(out, sysctl{name: t.name, value: int(t.d / time.Second)})
		}
	}
	if ct.tcpBeLiberal {
		out = append(out, sysctl{name: "net/netfilter/nf_conntrack_tcp_be_liberal", value: 1})
	}
	return out
}

// applySysctls makes the settings as kube-proxy does: a setting that already
// has its value is not written, so the daemon starts with a read-only
// /proc/sys (a container that is not privileged) once `--init-only` made
// them, in the DaemonSet's privileged init container. nf_conntrack_max is
// global and read-only outside the initial network namespace: that one is
// skipped with a log line; any other failure is an error.
func applySysctls(log *zap.Logger, settings []sysctl) error {
	return procSys.apply(log, settings)
}

// sysctlFS reads and writes settings under a /proc/sys.
type sysctlFS struct{ root string }

var procSys = sysctlFS{root: "/proc/sys"}

func (fs sysctlFS) apply(log *zap.Logger, settings []sysctl) error {
	for _, s := range settings {
		cur, err := fs.read(s.name)
		if err == nil && (cur == s.value || s.raiseOnly && cur >= s.value) {
			continue
		}
		err = os.WriteFile(filepath.Join(fs.root, s.name), []byte(strconv.Itoa(s.value)), 0o644)
		if err != nil && s.name == "net/netfilter/nf_conntrack_max" &&
			(errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrNotExist)) {
			log.Info("Skipping nf_conntrack_max: it cannot be set from this network namespace", zap.Int("wanted", s.value), zap.Error(err))
			continue
		}
		if errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("set sysctl %s=%d (now %d): %w; run `nftproxy run --init-only` with a writable /proc/sys first, as deploy/'s init container does", s.name, s.value, cur, err)
		}
		if err != nil {
			return fmt.Errorf("set sysctl %s=%d: %w", s.name, s.value, err)
		}
		log.Info("Set sysctl", zap.String("name", s.name), zap.Int("before", cur), zap.Int("value", s.value))
	}
	return nil
}

func (fs sysctlFS) read(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(fs.root, name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func readSysctl(name string) (int, error) { return procSys.read(name) }

// setOOMScoreAdj sets the process's oom_score_adj as kube-proxy does; a
// failure is logged, not fatal (kube-proxy's behaviour).
func setOOMScoreAdj(log *zap.Logger, v int) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(v)), 0o644); err != nil {
		log.Warn("Failed to set oom_score_adj", zap.Int("value", v), zap.Error(err))
	}
}

var numCPU = runtime.NumCPU
