package main

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/features"
	"github.com/nftproxy/nftproxy/proxier"
)

// probeKernel checks, before run changes anything, that the kernel has
// every feature the ruleset of the families and the flow cleanup use, so
// that a missing one stops the daemon with its name and minimum kernel
// instead of failing the first sync. Tests replace it.
var probeKernel = func(families []nftmodel.Family, conntrack bool) error {
	fs := features.Ruleset()
	if conntrack {
		fs = append(fs, features.ConntrackNetlink)
	}
	return features.NewProber(0, families...).Check(fs...)
}

// checkKernel probes the kernel for what cfgs will program.
func checkKernel(cfgs []proxier.Config, conntrack bool, log *zap.Logger) error {
	fams := make([]nftmodel.Family, 0, len(cfgs))
	for _, c := range cfgs {
		fams = append(fams, c.Family)
	}
	start := time.Now()
	if err := probeKernel(fams, conntrack); err != nil {
		return fmt.Errorf("check kernel features: %w", err)
	}
	log.Info("Kernel has every feature the ruleset uses", zap.Duration("probeTime", time.Since(start)))
	return nil
}
