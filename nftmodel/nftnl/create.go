package nftnl

import (
	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// Create adds the table rs describes, which must not exist, with everything
// in it, in one batch and without reading the kernel first: what Apply sends
// into a table that doesn't exist, in the same order. With owned, the table
// belongs to the connection's batch socket (Linux 5.12; older kernels refuse
// the flag): the kernel deletes it when that socket closes, and refuses
// changes to it from any other. The kernel feature probes (package
// features) program their throwaway tables this way.
//
// The table is dormant: its base chains register no hook, so no packet
// ever passes through them, while the kernel still parses every expression
// and validates every rule at commit (it walks the base chains of a dormant
// table too). A probe in the node's own namespace thus touches no traffic:
// its live nat chains once reset a connection opened during a restart.
func Create(conn *Conn, rs *nftmodel.Ruleset, owned bool) error {
	b := newBatch(conn, rs.Family, rs.Table)
	b.table.Flags = nftables.TableFlagDormant
	if owned {
		b.table.Flags |= nftables.TableFlagOwner
	}
	b.addTable()
	for _, s := range rs.Sets {
		if err := b.addSet(s); err != nil {
			return b.fail("create", err)
		}
	}
	for _, c := range rs.Chains {
		b.addChain(c)
	}
	if err := b.fill(rs); err != nil {
		return b.fail("create", err)
	}
	_, err := b.send("create", 0)
	return err
}

// Drop deletes the table (family, name), which must exist, in one batch:
// Create's undoing. (Delete adds the table first, so that a missing one is
// no error; the kernel refuses that addition to an owned table, as it would
// take the owner flag away.)
func Drop(conn *Conn, family nftmodel.Family, table string) error {
	b := newBatch(conn, family, table)
	b.delTable()
	_, err := b.send("drop", 0)
	return err
}
