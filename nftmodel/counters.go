package nftmodel

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// CounterPackets sums the packets that the counters in a chain's rules
// counted since those rules were written: what a metric of a rule's drops
// reads. A missing table or chain counts nothing.
func CounterPackets(conn *Conn, family Family, table, chain string) (uint64, error) {
	t := &nftables.Table{Name: table, Family: libFamily(family)}
	rules, err := conn.GetRules(t, &nftables.Chain{Name: chain, Table: t})
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
