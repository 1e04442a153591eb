package main

import (
	"context"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// netlinkKernel is the proxier's kernel writer: the netlink applier on one
// lasting connection in the daemon's network namespace.
type netlinkKernel struct{ conn *nftmodel.Conn }

func (k netlinkKernel) Apply(rs *nftmodel.Ruleset) (nftmodel.Stats, error) {
	return nftmodel.Apply(k.conn, rs)
}

func (k netlinkKernel) ApplyChanges(f nftmodel.Family, table string, c *nftmodel.Changes) (nftmodel.Stats, error) {
	return nftmodel.ApplyChanges(k.conn, f, table, c)
}

func (k netlinkKernel) Generation() (uint32, error) {
	return nftmodel.Generation(k.conn)
}

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
