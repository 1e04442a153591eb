package features

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// programTable commits a probe table per family with what program
// describes, written as nftproxy writes its tables (nftnl.Create), then
// removes the tables: the kernel checks hooks and jumps when a batch
// commits, and skips those checks for a table deleted in the same batch.
// The tables are owned by the probe's netlink socket where the kernel can
// (Linux 5.12), and go when it closes, even when the prober is killed; on
// older kernels a second batch deletes them. keep leaves the tables in
// place, unowned (tests list them).
func (p *Prober) programTable(name string, program func(*build), keep bool) error {
	conn, err := nftnl.Dial(p.netns)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()

	var unowned []nftmodel.Family
	for _, fam := range p.families {
		var owned bool
		if owned, err = p.create(conn, p.ruleset(fam, name, program), !keep); err != nil {
			break
		}
		if !owned {
			unowned = append(unowned, fam)
		}
	}
	if keep && err == nil {
		return nil
	}
	for _, fam := range unowned {
		if derr := nftnl.Drop(conn, fam, name); derr != nil && err == nil {
			err = fmt.Errorf("delete probe table: %w", derr)
		}
	}
	return err
}

// create creates the table rs, owned by conn's socket when own and the
// kernel knows owned tables, and tells whether it is owned.
func (p *Prober) create(conn *nftnl.Conn, rs *nftmodel.Ruleset, own bool) (bool, error) {
	owned := own && !p.noOwner
	err := nftnl.Create(conn, rs, owned)
	if err != nil && owned && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
		// A kernel before 5.12 knows no owner flag (and says EINVAL
		// before 5.10 or so), or the kernel lacks the feature: if the
		// table goes in without the flag, the flag was what it refused.
		owned = false
		if err = nftnl.Create(conn, rs, false); err == nil {
			p.noOwner = true
		}
	}
	return owned, err
}

// ruleset is the probe table name of family fam, as program describes it.
func (p *Prober) ruleset(fam nftmodel.Family, name string, program func(*build)) *nftmodel.Ruleset {
	b := &build{rs: &nftmodel.Ruleset{Family: fam, Table: name}}
	program(b)
	return b.rs
}

// tableName returns a table name no other probe, here or in another
// process, uses.
func (p *Prober) tableName() string {
	p.tables++
	return fmt.Sprintf("nftproxy-probe-%d-%d", os.Getpid(), p.tables)
}
