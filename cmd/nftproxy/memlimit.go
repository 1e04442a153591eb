package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// cgroupMemoryMax is the cgroup v2 limit of the container, as the container
// sees its own cgroup.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// memoryLimitShare is the part of the container's hard limit the garbage
// collector aims under: the rest is for what Go does not count (stacks
// aside, the kernel's socket buffers) and for a burst above the soft limit.
const memoryLimitShare = 0.9

// setMemoryLimit gives the Go runtime a soft memory limit below the
// container's: a full sync makes garbage several times its live heap, which
// by default Go lets pile up to twice the live heap before collecting, and
// a container near its limit would be OOM-killed mid-sync. GOMEMLIMIT, when
// set, is the operator's choice and the runtime already applied it.
func setMemoryLimit(log *zap.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("Memory limit from GOMEMLIMIT", zap.Int64("bytes", debug.SetMemoryLimit(-1)))
		return
	}
	data, err := os.ReadFile(cgroupMemoryMax)
	if err != nil {
		log.Debug("No cgroup memory limit to follow", zap.Error(err))
		return
	}
	limit, err := softLimit(string(data))
	if err != nil {
		log.Warn("Ignoring the cgroup memory limit", zap.String("file", cgroupMemoryMax), zap.Error(err))
		return
	}
	if limit == 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Info("Memory limit set below the container's", zap.Int64("bytes", limit), zap.Float64("share", memoryLimitShare))
}

// softLimit is the soft limit for the contents of memory.max: none (0) for
// "max", else memoryLimitShare of it.
func softLimit(memoryMax string) (int64, error) {
	s := strings.TrimSpace(memoryMax)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse memory.max: %w", err)
	}
	if n <= 0 {
		return 0, errors.New("parse memory.max: not a positive size")
	}
	return int64(math.Floor(float64(n) * memoryLimitShare)), nil
}

// loadGCPercent is the collector's target while the first state loads:
// decoding 100k manifests makes garbage many times the state it keeps, and
// at Go's default the resident peak was twice the steady state before a
// single rule was compiled. Start-up takes a little longer instead.
const loadGCPercent = 25

// syncMemoryFactor bounds a full sync's memory (proxier.Options.
// FullSyncMemoryFactor) to 1.4 times what the runtime holds as it starts:
// a sync leaves at least the state it found, so the peak stays within 1.4
// times the state after it. At 100k services × 3 the peak fell from 420 to
// 317 MiB beside 245 MiB steady (docs/design.md "Memory"); a sync whose
// heap stays below costs nothing more (10k × 3 through the API server).
const syncMemoryFactor = 1.4

// leanGCPercent is loadGCPercent, or 0 (leave it) when GOGC is the
// operator's choice.
func leanGCPercent() int {
	if gogcSet() {
		return 0
	}
	return loadGCPercent
}

// fullSyncMemoryFactor is syncMemoryFactor, or 0 (none) when GOGC is the
// operator's choice.
func fullSyncMemoryFactor() float64 {
	if gogcSet() {
		return 0
	}
	return syncMemoryFactor
}

// gogcSet tells whether the operator tuned the collector with GOGC.
func gogcSet() bool { return os.Getenv("GOGC") != "" }

// leanLoad runs load with the collector at leanGCPercent, then gives the
// load's garbage back to the OS so that the first sync starts from what the
// daemon keeps.
func leanLoad(log *zap.Logger, load func() error) error {
	if pct := leanGCPercent(); pct > 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(pct))
	}
	err := load()
	start := time.Now()
	debug.FreeOSMemory()
	log.Debug("Released memory after loading the first state", zap.Duration("took", time.Since(start)))
	return err
}
