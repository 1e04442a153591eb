package main

import (
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/features"
	"github.com/nftproxy/nftproxy/proxier"
)

// probeKernel checks, before run changes anything, that the kernel has
// every feature the ruleset of the families and the flow cleanup use, so
// that a missing one stops the daemon with its name and minimum kernel
// instead of failing the first sync. It probes in the network namespace
// whose descriptor is netns (0: the daemon's own). Tests replace it.
var probeKernel = func(netns int, families []nftmodel.Family, conntrack bool) error {
	fs := features.Ruleset()
	if conntrack {
		fs = append(fs, features.ConntrackNetlink)
	}
	return features.NewProber(netns, families...).Check(fs...)
}

// checkKernel probes the kernel for what cfgs will program, in a namespace
// of its own where it may make one: the probes' tables never see the
// node's traffic then.
func checkKernel(cfgs []proxier.Config, conntrack bool, log *zap.Logger) error {
	fams := make([]nftmodel.Family, 0, len(cfgs))
	for _, c := range cfgs {
		fams = append(fams, c.Family)
	}
	start := time.Now()
	netns, err := features.PrivateNetns()
	where := "a namespace of its own"
	if err != nil {
		// Without CAP_SYS_ADMIN (deploy/'s DaemonSet adds NET_ADMIN alone).
		log.Info("Probing the kernel in the node's network namespace, in dormant tables that no packet meets", zap.Error(err))
		netns, where = 0, "the node's network namespace"
	} else {
		defer func() { _ = unix.Close(netns) }()
	}
	if err := probeKernel(netns, fams, conntrack); err != nil {
		return fmt.Errorf("check kernel features: %w", err)
	}
	log.Info("Kernel has every feature the ruleset uses", zap.Duration("probeTime", time.Since(start)), zap.String("probedIn", where))
	return nil
}
