package features

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// build is one family's probe table while a feature programs it.
type build struct {
	raw    *nftnl.RawBatch
	c      *nftables.Conn // raw's queue: encodes messages, sends nothing
	t      *nftables.Table
	family nftmodel.Family
}

// programTable commits, in one batch, a probe table per family with what
// program queues into it, then deletes the tables in a second batch: the
// kernel checks hooks and jumps when a batch commits, and skips those checks
// for a table deleted in the same batch. The tables are owned by the
// probe's netlink socket where the kernel can (Linux 5.12), so that even a
// prober killed between the two batches leaves nothing behind. keep leaves
// the tables in place, unowned (tests list them).
func (p *Prober) programTable(name string, program func(*build) error, keep bool) error {
	conn, err := nftnl.Dial(p.netns)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()

	owned := !keep && !p.noOwner
	err = p.send(conn, name, owned, program)
	var refused *nftnl.RefusedError
	if err != nil && owned && errors.As(err, &refused) && refused.Verb == nftnl.VerbAddTable &&
		(errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
		// A kernel before 5.12 knows no owner flag (and says EINVAL
		// before 5.10 or so): probe without it.
		p.noOwner, owned = true, false
		err = p.send(conn, name, owned, program)
	}
	if err != nil || keep {
		return err
	}
	if err := p.send(conn, name, owned, nil); err != nil {
		return fmt.Errorf("delete probe table %s: %w", name, err)
	}
	return nil
}

// tableName returns a table name no other probe, here or in another
// process, uses.
func (p *Prober) tableName() string {
	p.tables++
	return fmt.Sprintf("nftproxy-probe-%d-%d", os.Getpid(), p.tables)
}

// send sends the batch that adds the probe table of every family with what
// program queues, or, with a nil program, the batch that deletes them.
func (p *Prober) send(conn *nftnl.Conn, name string, owned bool, program func(*build) error) error {
	raw, err := p.batch(name, owned, program)
	if err != nil {
		return err
	}
	return raw.Send(conn)
}

// batch queues what send sends.
func (p *Prober) batch(name string, owned bool, program func(*build) error) (*nftnl.RawBatch, error) {
	raw := nftnl.NewRawBatch()
	for _, fam := range p.families {
		if program == nil {
			raw.DelTable(fam, name)
			continue
		}
		b := &build{raw: raw, c: raw.Lib(), t: raw.AddTable(fam, name, owned), family: fam}
		if err := program(b); err != nil {
			return nil, fmt.Errorf("encode probe batch: %w", err)
		}
	}
	return raw, nil
}
