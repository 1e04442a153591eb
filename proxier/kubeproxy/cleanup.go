package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// Backend is one family's legacy iptables, with the tools kube-proxy itself
// uses to write it.
type Backend struct {
	Name          string
	Family        nftmodel.Family
	Save, Restore string
}

// LegacyBackends are the legacy iptables kube-proxy may have written to. The
// nft backend's tables are nftables tables, cleaned over netlink (no tools).
var LegacyBackends = []Backend{
	{"iptables-legacy", nftmodel.IPv4, "iptables-legacy-save", "iptables-legacy-restore"},
	{"ip6tables-legacy", nftmodel.IPv6, "ip6tables-legacy-save", "ip6tables-legacy-restore"},
}

// loadedTables returns which of nat, filter and mangle the kernel has in
// b's legacy iptables in this namespace, without running any iptables tool
// (that would load its modules and make tables).
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
// from the nft backend over netlink, in one batch; from the legacy backend
// with its own tools, where its tables are loaded. When they are loaded but
// the tools are missing (nftproxy's image has none), it logs one warning
// naming the tables and the way to clean them, and goes on: no retry would
// find the tools. An error in one backend does not stop the others.
func CleanupIPTables(ctx context.Context, conn *nftnl.Conn, log *zap.Logger) ([]string, error) {
	var errs []error
	removed, err := CleanupNFT(conn)
	if err != nil {
		errs = append(errs, err)
	}
	if len(removed) > 0 {
		log.Info("Removed kube-proxy's iptables chains", zap.String("backend", "iptables-nft"), zap.Int("chains", len(removed)))
	}
	var left, missing []string
	for _, b := range LegacyBackends {
		loaded, err := b.loadedTables()
		if err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", b.Name, err))
			continue
		}
		if len(loaded) == 0 {
			continue
		}
		if m := missingTools(b.Save, b.Restore); len(m) > 0 {
			for _, t := range loaded {
				left = append(left, b.Name+" "+t)
			}
			missing = append(missing, m...)
			continue
		}
		r, err := b.cleanup(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, c := range r {
			removed = append(removed, b.Name+": "+c)
		}
		if len(r) > 0 {
			log.Info("Removed kube-proxy's iptables chains", zap.String("backend", b.Name), zap.Int("chains", len(r)))
		}
	}
	if len(left) > 0 {
		log.Warn("Kube-proxy's legacy iptables chains may be left: these legacy tables are loaded, but the legacy tools "+
			"are not installed (nftproxy's image has none); once nftproxy has synced, run `kube-proxy --cleanup` from "+
			"kube-proxy's image, or `nftproxy cleanup --kube-proxy` where the tools are installed",
			zap.Strings("tables", left), zap.Strings("missing", missing))
	}
	return removed, errors.Join(errs...)
}

func missingTools(tools ...string) []string {
	var out []string
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			out = append(out, t)
		}
	}
	return out
}

func (b Backend) cleanup(ctx context.Context) ([]string, error) {
	var out, stderr bytes.Buffer
	save := exec.CommandContext(ctx, b.Save)
	save.Stdout, save.Stderr = &out, &stderr
	if err := save.Run(); err != nil {
		return nil, fmt.Errorf("clean %s: run %s: %w: %s", b.Name, b.Save, err, strings.TrimSpace(stderr.String()))
	}
	script, removed, err := Plan(out.String())
	if err != nil || script == "" {
		return nil, err
	}
	stderr.Reset()
	restore := exec.CommandContext(ctx, b.Restore, "--noflush", "--wait")
	restore.Stdin, restore.Stderr = strings.NewReader(script), &stderr
	if err := restore.Run(); err != nil {
		return nil, fmt.Errorf("clean %s: run %s: %w: %s\ninput:\n%s", b.Name, b.Restore, err, strings.TrimSpace(stderr.String()), script)
	}
	return removed, nil
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
