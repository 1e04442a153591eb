package nftnl

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// pruneAttempts bounds how often PruneElements dumps the set again because
// an element it meant to delete timed out first.
const pruneAttempts = 3

// PruneElements deletes, in one batch, the elements of the dynamic map
// set (one the packet path fills, as session affinity's) for which keep
// returns false, and returns how many it deleted. The kernel refuses the
// whole batch when an element timed out between the dump and the batch
// (ENOENT): the set is then dumped again.
func PruneElements(conn *Conn, family nftmodel.Family, table string, set *nftmodel.Set, keep func(nftmodel.Element) bool) (int, error) {
	for attempt := 1; ; attempt++ {
		stale, err := staleElements(conn, family, table, set, keep)
		if err != nil || len(stale) == 0 {
			return 0, err
		}
		_, err = ApplyChanges(conn, family, table, &nftmodel.Changes{DelElements: []nftmodel.SetElements{
			{Set: set.Name, Key: set.Key, Data: set.Data, Timeout: set.Timeout, Elements: stale}}})
		switch {
		case err == nil:
			return len(stale), nil
		case attempt == pruneAttempts || !errors.Is(err, unix.ENOENT):
			return 0, fmt.Errorf("prune set %s: %w", set.Name, err)
		}
	}
}

// staleElements dumps the set and returns the elements keep refuses.
func staleElements(conn *Conn, family nftmodel.Family, table string, set *nftmodel.Set, keep func(nftmodel.Element) bool) ([]nftmodel.Element, error) {
	t := &nftables.Table{Name: table, Family: libFamily(family)}
	ls, err := conn.getSetByName(t, set.Name)
	if err != nil {
		return nil, fmt.Errorf("get set %s: %w", set.Name, err)
	}
	les, err := conn.getSetElements(ls)
	if err != nil {
		return nil, fmt.Errorf("list elements of set %s: %w", set.Name, err)
	}
	var stale []nftmodel.Element
	for _, le := range les {
		key, err := readValues(set.Key, le.Key)
		if err != nil {
			return nil, fmt.Errorf("read element of set %s: %w", set.Name, err)
		}
		data, err := readValues(set.Data, le.Val)
		if err != nil {
			return nil, fmt.Errorf("read element of set %s: %w", set.Name, err)
		}
		if el := (nftmodel.Element{Key: key, Data: data}); !keep(el) {
			stale = append(stale, el)
		}
	}
	return stale, nil
}
