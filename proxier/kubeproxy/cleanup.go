package kubeproxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// Backend is one family's legacy iptables.
type Backend struct {
	Name   string
	Family nftmodel.Family
}

// LegacyBackends are the legacy iptables kube-proxy may have written to. The
// nft backend's tables are nftables tables, cleaned over netlink.
var LegacyBackends = []Backend{
	{"iptables-legacy", nftmodel.IPv4},
	{"ip6tables-legacy", nftmodel.IPv6},
}

// loadedTables returns which of nat, filter and mangle the kernel has in
// b's legacy iptables in this namespace, without touching the others
// (asking for a table that is not loaded would load its module and make it).
func (b Backend) loadedTables() ([]string, error) {
	file := "/proc/thread-self/net/ip_tables_names"
	if b.Family == nftmodel.IPv6 {
		file = "/proc/thread-self/net/ip6_tables_names"
	}
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // legacy iptables not loaded
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var out []string
	for _, t := range strings.Fields(string(data)) {
		if slices.Contains(tables, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out, nil
}

// CleanupIPTables removes kube-proxy's iptables chains and the rules
// jumping to them, and returns what it removed ("backend: table/chain"):
// from the nft backend over netlink, in one batch; from each loaded table
// of the legacy backend with one replace of the table over a raw socket,
// as iptables-legacy-restore does, so that no iptables tool is needed
// (nftproxy's image has none). An error in one table does not stop the
// others; ctx stops it between tables.
func CleanupIPTables(ctx context.Context, conn *nftnl.Conn, log *zap.Logger) ([]string, error) {
	var errs []error
	removed, err := CleanupNFT(conn)
	if err != nil {
		errs = append(errs, err)
	}
	if len(removed) > 0 {
		log.Info("Removed kube-proxy's iptables chains", zap.String("backend", "iptables-nft"), zap.Int("chains", len(removed)))
	}
	for _, b := range LegacyBackends {
		loaded, err := b.loadedTables()
		if err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", b.Name, err))
			continue
		}
		n := 0
		for _, t := range loaded {
			if err := ctx.Err(); err != nil {
				return removed, errors.Join(append(errs, fmt.Errorf("clean %s: %w", b.Name, err))...)
			}
			r, err := pruneLegacy(b.Family, t)
			if err != nil {
				errs = append(errs, fmt.Errorf("clean %s: %w", b.Name, err))
			}
			for _, c := range r {
				removed = append(removed, b.Name+": "+c)
			}
			n += len(r)
		}
		if n > 0 {
			log.Info("Removed kube-proxy's iptables chains", zap.String("backend", b.Name), zap.Int("chains", n))
		}
	}
	return removed, errors.Join(errs...)
}

// DeleteTables deletes kube-proxy's nftables tables, if they exist.
func DeleteTables(conn *nftnl.Conn) error {
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		if err := nftnl.Delete(conn, f, TableName); err != nil {
			return fmt.Errorf("delete kube-proxy's table: %w", err)
		}
	}
	return nil
}

// Replacer is the daemon's kernel when nftproxy replaces kube-proxy: the
// first full apply of each family deletes kube-proxy's table of that family
// in the same batch, and once every family has been applied, IPTables
// removes kube-proxy's iptables chains (retried at the next full sync when
// it fails). The rest is the nftnl.Kernel's.
type Replacer struct {
	nftnl.Kernel
	Families int // how many families the proxier applies
	IPTables func() error
	Logger   *zap.Logger

	replaced     map[nftmodel.Family]bool
	iptablesDone bool
}

func (r *Replacer) Apply(rs *nftmodel.Ruleset) (nftmodel.Stats, error) {
	if r.replaced[rs.Family] {
		stats, err := r.Kernel.Apply(rs)
		if err == nil {
			r.afterSync()
		}
		return stats, err
	}
	stats, err := nftnl.ApplyReplacing(r.Conn, rs, TableName)
	if err != nil {
		return stats, err
	}
	if r.replaced == nil {
		r.replaced = map[nftmodel.Family]bool{}
	}
	r.replaced[rs.Family] = true
	r.Logger.Info("Replaced kube-proxy's nftables table, if any, in the same batch", zap.Stringer("family", rs.Family))
	r.afterSync()
	return stats, nil
}

func (r *Replacer) afterSync() {
	if r.iptablesDone || len(r.replaced) < r.Families || r.IPTables == nil {
		return
	}
	if err := r.IPTables(); err != nil {
		r.Logger.Error("Removing kube-proxy's iptables chains failed; retrying at the next full sync", zap.Error(err))
		return
	}
	r.iptablesDone = true
}
