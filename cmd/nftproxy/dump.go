package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// dump prints the ruleset of every family the flags would apply.
func dump(w io.Writer, o *options, log *zap.Logger) error {
	cfgs, snap, err := loadOffline(o, log)
	if err != nil {
		return err
	}
	for _, cfg := range cfgs {
		if _, err := fmt.Fprint(w, nftmodel.Render(proxier.Compile(snap, cfg))); err != nil {
			return err
		}
	}
	return nil
}

// loadOffline checks the flags, then reads the manifest directory once: what
// dump and explain work from.
func loadOffline(o *options, log *zap.Logger) ([]proxier.Config, *k8s.Snapshot, error) {
	cfgs, err := o.compileConfigs()
	if err != nil {
		return nil, nil, err
	}
	snap, err := loadSnapshot(o, log)
	return cfgs, snap, err
}

// loadSnapshot reads the manifest directory once.
func loadSnapshot(o *options, log *zap.Logger) (*k8s.Snapshot, error) {
	if o.manifests == "" {
		return nil, errors.New("--manifests is required")
	}
	tracker, err := newTracker(o, log, proxier.NewMetrics())
	if err != nil {
		return nil, err
	}
	// One load, the same way the daemon's first one goes; the watch ends at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k8s.WatchDir(ctx, o.manifests, tracker, log, 0); err != nil {
		return nil, err
	}
	return tracker.Snapshot(), nil
}
