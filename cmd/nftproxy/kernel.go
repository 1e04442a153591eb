package main

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/kubeproxy"
)

// flowCleaner adapts the conntrack reconciler to the proxier.
type flowCleaner struct{ r *conntrack.Reconciler }

func (f flowCleaner) Clean(ctx context.Context, prev, next *k8s.Snapshot) (proxier.FlowsDeleted, error) {
	res, err := f.r.Reconcile(ctx, prev, next)
	return proxier.FlowsDeleted{IPv4: res.Deleted - res.DeletedIPv6, IPv6: res.DeletedIPv6}, err
}

// cleanup removes nftproxy's tables of both families from this namespace,
// and turns route_localnet off again where nftproxy turned it on.
func cleanup() error {
	conn, err := nftnl.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	owned := ownsRouteLocalnet(conn)
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		if err := nftnl.Delete(conn, f, proxier.TableName); err != nil {
			return err
		}
	}
	return restoreRouteLocalnet(owned)
}

// cleanupKubeProxy removes kube-proxy's iptables chains and nftables tables
// from this namespace, and nothing else.
func cleanupKubeProxy(ctx context.Context, log *zap.Logger) error {
	conn, err := nftnl.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	removed, err := kubeproxy.CleanupIPTables(ctx, conn, log)
	if err != nil {
		return err
	}
	for _, r := range removed {
		fmt.Println("removed iptables chain", r)
	}
	return kubeproxy.DeleteTables(conn)
}

// kernel is the proxier's kernel: the netlink applier, which replaces
// kube-proxy's rules at the first sync when asked to.
func kernel(ctx context.Context, o *options, conn *nftnl.Conn, families int, log *zap.Logger) proxier.Kernel {
	k := nftnl.Kernel{Conn: conn}
	if !o.cleanupKubeProxy {
		return k
	}
	return &kubeproxy.Replacer{Kernel: k, Families: families, Logger: log, IPTables: func() error {
		_, err := kubeproxy.CleanupIPTables(ctx, conn, log)
		return err
	}}
}
