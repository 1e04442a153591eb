package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/k8s"
	"golang.org/x/sys/unix"
)

// Table is the conntrack table of one network namespace.
type Table interface {
	// Dump returns every flow in the table.
	Dump(ctx context.Context) ([]Flow, error)
	// Delete removes one flow. An error matching ErrNotExist means the flow
	// was already gone.
	Delete(ctx context.Context, f Flow) error
}

// ErrNotExist is what Table.Delete returns (or wraps) when the flow is not in
// the table any more; netlink reports it as ENOENT.
var ErrNotExist error = unix.ENOENT

// Result describes one Reconcile call, for metrics and logs.
type Result struct {
	// Skipped is true when no service address changed in a way that can
	// leave stale flows, so the table was not dumped.
	Skipped bool
	Dumped  int // flows read from the table
	Stale   int // flows selected for deletion
	Deleted int // flows this call removed
	// DeletedIPv6 are the IPv6 flows among Deleted.
	DeletedIPv6 int
	Gone        int // stale flows someone else removed first
	Failed      int // stale flows whose deletion failed
	// Duration is the wall time of the whole call, dump included.
	Duration time.Duration
}

// Reconciler deletes stale flows from a Table after ruleset changes. It keeps
// the previous snapshot of a failed call, so the next call covers the failed
// change too. Reconcile calls are serialized.
type Reconciler struct {
	table      Table
	localAddrs []netip.Addr

	// LocalAddrs, when set, is asked on each call for the addresses
	// NodePorts answer on now (they answer on every local address, not only
	// the Node's); InterfaceAddrs is the daemon's.
	LocalAddrs func() ([]netip.Addr, error)

	mu sync.Mutex
	// pending is set after a failed call; pendingPrev is the prev of the
	// oldest change not yet reconciled (nil: unknown).
	pending     bool
	pendingPrev *k8s.Snapshot
}

// NewReconciler returns a Reconciler working on table. localAddrs are the
// local addresses NodePorts answer on beyond Snapshot.Node.Addrs; see Stale.
func NewReconciler(table Table, localAddrs ...netip.Addr) *Reconciler {
	return &Reconciler{table: table, localAddrs: localAddrs}
}

// Reconcile deletes the flows that became stale when the ruleset built from
// prev was replaced by the one built from next; call it after next's ruleset
// was committed. prev is nil on the first sync after start.
//
// Errors are never fatal: the caller logs them and goes on. After an error
// the next call reconciles from this call's prev too, so a failed dump or
// delete is retried on the next sync. prev and next may hold only the
// service ports that changed: flows to the others are left alone. Flows deleted by someone else meanwhile count
// in Result.Gone, not as errors.
func (r *Reconciler) Reconcile(ctx context.Context, prev, next *k8s.Snapshot) (res Result, err error) {
	start := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending {
		prev = withPending(r.pendingPrev, prev)
	}
	defer func() {
		res.Duration = time.Since(start)
		if err != nil && !r.pending {
			r.pending, r.pendingPrev = true, prev
		} else if err == nil {
			r.pending, r.pendingPrev = false, nil
		}
	}()

	local := r.localAddrs
	var addrErr error
	if r.LocalAddrs != nil {
		// Without them the Node's addresses still cover part of the change:
		// reconcile anyway and report the failure.
		var more []netip.Addr
		more, addrErr = r.LocalAddrs()
		local = slices.Concat(local, more)
	}
	defer func() { err = errors.Join(err, addrErr) }()
	sel := newSelector(prev, next, local)
	if !sel.mayHaveStale() {
		res.Skipped = true
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("reconcile conntrack: %w", err)
	}
	flows, err := r.table.Dump(ctx)
	if err != nil {
		return res, fmt.Errorf("dump conntrack table: %w", err)
	}
	res.Dumped = len(flows)

	var firstErr error
	var firstFlow Flow
	for _, f := range flows {
		if !sel.stale(f) {
			continue
		}
		res.Stale++
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("delete stale flows: %w", err)
		}
		switch err := r.table.Delete(ctx, f); {
		case err == nil:
			res.Deleted++
			if f.OrigDst.Addr().Is6() {
				res.DeletedIPv6++
			}
		case errors.Is(err, ErrNotExist):
			res.Gone++
		default:
			res.Failed++
			if firstErr == nil {
				firstErr, firstFlow = err, f
			}
		}
	}
	if firstErr != nil {
		return res, fmt.Errorf("delete stale flow %s (%d of %d failed): %w", firstFlow, res.Failed, res.Stale, firstErr)
	}
	return res, nil
}

// withPending is the prev of a retry: the failed call's service ports, and
// those of this call's prev the failed call lacks (the proxier passes only
// the ports a sync changed); the older version of a port is the one the
// flows met. Nil when either is unknown.
func withPending(pending, prev *k8s.Snapshot) *k8s.Snapshot {
	if pending == nil || prev == nil {
		return nil
	}
	if pending == prev {
		return prev
	}
	out := &k8s.Snapshot{Services: slices.Clone(pending.Services), Node: pending.Node, ServiceCIDRs: pending.ServiceCIDRs}
	out.Node.Addrs = slices.Concat(pending.Node.Addrs, prev.Node.Addrs)
	had := make(map[k8s.ServicePortName]bool, len(pending.Services))
	for i := range pending.Services {
		had[pending.Services[i].Name] = true
	}
	for _, sp := range prev.Services {
		if !had[sp.Name] {
			out.Services = append(out.Services, sp)
		}
	}
	return out
}
