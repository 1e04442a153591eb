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

// Backend is one family's iptables of one kind, with the tools kube-proxy
// itself uses to write it.
type Backend struct {
	Name          string
	Family        nftmodel.Family
	Legacy        bool
	Save, Restore string
}

// Backends are the four iptables kube-proxy may have written to.
var Backends = []Backend{
	{"iptables-legacy", nftmodel.IPv4, true, "iptables-legacy-save", "iptables-legacy-restore"},
	{"ip6tables-legacy", nftmodel.IPv6, true, "ip6tables-legacy-save", "ip6tables-legacy-restore"},
	{"iptables-nft", nftmodel.IPv4, false, "iptables-nft-save", "iptables-nft-restore"},
	{"ip6tables-nft", nftmodel.IPv6, false, "ip6tables-nft-save", "ip6tables-nft-restore"},
}

// mayHoldChains tells, without running any iptables tool, whether b may
// hold kube-proxy's chains in this namespace: for the legacy backend,
// whether the kernel has any of its tables here (running its tools
// otherwise would load its modules and make tables); for the nft backend,
// whether its nat, filter or mangle table has a chain of kube-proxy's name.
func (b Backend) mayHoldChains(conn *nftnl.Conn) (bool, error) {
	if b.Legacy {
		file := "/proc/thread-self/net/ip_tables_names"
		if b.Family == nftmodel.IPv6 {
			file = "/proc/thread-self/net/ip6_tables_names"
		}
		data, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			return false, nil // legacy iptables not loaded
		}
		if err != nil {
			return false, fmt.Errorf("read %s: %w", file, err)
		}
		return len(bytes.TrimSpace(data)) > 0, nil
	}
	cs, err := conn.Chains(b.Family)
	if err != nil {
		return false, err
	}
	for _, c := range cs {
		if slices.Contains(tables, c.Table) && IsChain(c.Chain) {
			return true, nil
		}
	}
	return false, nil
}

// CleanupIPTables removes kube-proxy's iptables chains and the rules
// jumping to them from every backend that has them, and returns what it
// removed ("backend: table/chain"). A backend without kube-proxy's chains
// is left alone; one whose tools are missing while it may hold them is an
// error, after the others were cleaned.
func CleanupIPTables(ctx context.Context, conn *nftnl.Conn, log *zap.Logger) ([]string, error) {
	var removed []string
	var errs []error
	for _, b := range Backends {
		may, err := b.mayHoldChains(conn)
		if err != nil {
			errs = append(errs, fmt.Errorf("clean %s: %w", b.Name, err))
			continue
		}
		if !may {
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
	return removed, errors.Join(errs...)
}

func (b Backend) cleanup(ctx context.Context) ([]string, error) {
	var out, stderr bytes.Buffer
	save := exec.CommandContext(ctx, b.Save)
	save.Stdout, save.Stderr = &out, &stderr
	if err := save.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("clean %s: kube-proxy's chains may be there but %s is not installed: %w", b.Name, b.Save, err)
		}
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
