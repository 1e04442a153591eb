package main

import (
	"context"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// flowCleaner adapts the conntrack reconciler to the proxier.
type flowCleaner struct{ r *conntrack.Reconciler }

func (f flowCleaner) Clean(ctx context.Context, prev, next *k8s.Snapshot) (int, error) {
	res, err := f.r.Reconcile(ctx, prev, next)
	return res.Deleted, err
}

// cleanup removes nftproxy's tables of both families from this namespace.
func cleanup() error {
	conn, err := nftmodel.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.CloseLasting() }()
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		if err := nftmodel.Delete(conn, f, proxier.TableName); err != nil {
			return err
		}
	}
	return nil
}
