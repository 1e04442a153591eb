package nftnl

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// CounterPackets sums the packets that the counters in a chain's rules
// counted since those rules were written: what a metric of a rule's drops
// reads. A missing table or chain counts nothing.
func CounterPackets(conn *Conn, family nftmodel.Family, table, chain string) (uint64, error) {
	t := &nftables.Table{Name: table, Family: libFamily(family)}
	rules, err := conn.getRules(t, &nftables.Chain{Name: chain, Table: t})
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get rules of chain %s %s %s: %w", family, table, chain, err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n, nil
}

// CounterPackets reads a chain's rule counters (proxier.CounterReader).
func (k Kernel) CounterPackets(f nftmodel.Family, table, chain string) (uint64, error) {
	return CounterPackets(k.Conn, f, table, chain)
}
