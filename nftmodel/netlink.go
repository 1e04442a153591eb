package nftmodel

import (
	"fmt"

	"github.com/google/nftables"
)

// Stats counts what one batch carried.
type Stats struct {
	Messages int // netlink messages in the batch, batch begin and end included
	Elements int // set elements added or deleted (anonymous maps' included)
	Rules    int // rules added
	Chains   int // chains added, flushed or deleted
	Sets     int // named sets added or deleted
}

// maxCommentLen is the longest comment nft accepts (NFTNL_UDATA_COMMENT_MAXLEN);
// the kernel would take longer ones, but then the text could not be loaded.
const maxCommentLen = 128

// Dial opens a lasting nftables connection in the network namespace netnsFd
// (0 for the caller's own); close it with CloseLasting. The applier works
// with any *Conn, but only on a lasting one can a kernel error name the
// object it refused (see locate). Socket buffers are left to google/nftables,
// which sizes them for each batch before sending it (forcing past
// rmem_max/wmem_max when we are root).
func Dial(netnsFd int) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if netnsFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(netnsFd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("dial nftables: %w", err)
	}
	return c, nil
}

// Apply replaces the whole table with rs in one batch: the table is added
// (so that deleting it can't fail), deleted with everything in it, and added
// again with its sets, chains, elements and rules. Sets are declared before
// chains and chains in model order, so `nft list table` prints them in the
// model's order; elements follow the chains their verdicts name.
//
// Any error from the kernel leaves the table's state unknown: the caller must
// apply in full again.
func Apply(conn *nftables.Conn, rs *Ruleset) (Stats, error) {
	b := newBatch(conn, rs.Family, rs.Table)
	b.addTable()
	b.delTable()
	b.addTable()
	for _, s := range rs.Sets {
		if err := b.addSet(s); err != nil {
			return Stats{}, b.fail("apply", err)
		}
	}
	for _, c := range rs.Chains {
		b.addChain(c)
	}
	for _, s := range rs.Sets {
		if err := b.addElements(s.Name, s.Elements); err != nil {
			return Stats{}, b.fail("apply", err)
		}
	}
	for _, c := range rs.Chains {
		if err := b.addRules(c); err != nil {
			return Stats{}, b.fail("apply", err)
		}
	}
	return b.send("apply")
}

// ApplyChanges sends c as one batch against the table (family, table), in the
// order documented on Changes; the elements of new sets are added with the
// other elements, after the chains their verdicts may name.
//
// Changes name the sets whose elements change but not their types, which the
// element encoding needs; the types of sets that c does not add are read from
// the kernel (one request per set) before the batch is built.
func ApplyChanges(conn *nftables.Conn, family Family, table string, c *Changes) (Stats, error) {
	b := newBatch(conn, family, table)
	for _, s := range c.AddSets {
		if err := b.addSet(s); err != nil {
			return Stats{}, b.fail("apply changes to", err)
		}
	}
	if err := b.learnSets(c); err != nil {
		return Stats{}, b.fail("apply changes to", err)
	}
	for _, ch := range c.AddChains {
		b.addChain(ch)
	}
	for _, se := range c.DelElements {
		if err := b.delElements(se.Set, se.Elements); err != nil {
			return Stats{}, b.fail("apply changes to", err)
		}
	}
	for _, ch := range c.RewriteChains {
		b.flushChain(ch.Name)
		if err := b.addRules(ch); err != nil {
			return Stats{}, b.fail("apply changes to", err)
		}
	}
	// Rules of chains about to go may jump to each other: empty them all
	// first so no deletion finds its chain still referenced.
	for _, name := range c.DelChains {
		b.flushChain(name)
	}
	for _, s := range c.AddSets {
		if err := b.addElements(s.Name, s.Elements); err != nil {
			return Stats{}, b.fail("apply changes to", err)
		}
	}
	for _, se := range c.AddElements {
		if err := b.addElements(se.Set, se.Elements); err != nil {
			return Stats{}, b.fail("apply changes to", err)
		}
	}
	for _, name := range c.DelSets {
		b.delSet(name)
	}
	for _, name := range c.DelChains {
		b.delChain(name)
	}
	return b.send("apply changes to")
}

// Delete removes the table (family, name) with everything in it, if it
// exists, in one batch.
func Delete(conn *nftables.Conn, family Family, table string) error {
	b := newBatch(conn, family, table)
	b.addTable() // so that the deletion can't fail with ENOENT
	b.delTable()
	_, err := b.send("delete")
	return err
}
