package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// netlinkKernel is the proxier's kernel writer: the netlink applier on one
// lasting connection in the daemon's network namespace.
type netlinkKernel struct{ conn *nftables.Conn }

func (k netlinkKernel) Apply(rs *nftmodel.Ruleset) (nftmodel.Stats, error) {
	return nftmodel.Apply(k.conn, rs)
}

func (k netlinkKernel) ApplyChanges(f nftmodel.Family, table string, c *nftmodel.Changes) (nftmodel.Stats, error) {
	return nftmodel.ApplyChanges(k.conn, f, table, c)
}

// flowCleaner adapts the conntrack reconciler to the proxier. NodePorts
// answer on every local address (fib daddr type local), not only on the Node
// object's or --node-ip's, and the reconciler finds a NodePort flow by its
// destination address: each call adds the namespace's current addresses, or
// NodePort flows would never be found stale.
type flowCleaner struct{ r *conntrack.Reconciler }

func (f flowCleaner) Clean(ctx context.Context, prev, next *k8s.Snapshot) (int, error) {
	// Without the local addresses the Node's still cover part of the
	// change: reconcile anyway, and report the failure.
	local, addrErr := localAddrs()
	res, err := f.r.Reconcile(ctx, withNodeAddrs(prev, local), withNodeAddrs(next, local))
	return res.Deleted, errors.Join(err, addrErr)
}

// localAddrs lists the addresses of this network namespace's interfaces.
func localAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list local addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifAddrs))
	for _, a := range ifAddrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// withNodeAddrs returns snap with addrs added to its node's addresses,
// leaving snap itself untouched (snapshots are shared and immutable).
func withNodeAddrs(snap *k8s.Snapshot, addrs []netip.Addr) *k8s.Snapshot {
	if snap == nil || len(addrs) == 0 {
		return snap
	}
	c := *snap
	c.Node.Addrs = slices.Concat(snap.Node.Addrs, addrs)
	return &c
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
