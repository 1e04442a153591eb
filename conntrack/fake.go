package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// FakeTable is an in-memory Table for unit tests. Delete removes the flow
// from Flows and appends it to Deleted; deleting a flow that is not in Flows
// returns ErrNotExist, as the kernel does. DumpErr and DeleteErr, when set,
// make every Dump or Delete fail with them. Tests may set the fields directly
// between calls.
type FakeTable struct {
	Flows     []Flow
	Deleted   []Flow
	DumpErr   error
	DeleteErr error

	mu  sync.Mutex
	pos map[fakeKey]int // index into Flows, rebuilt when found out of date
}

// fakeKey is what the kernel finds a flow by on delete.
type fakeKey struct {
	proto            uint8
	origSrc, origDst netip.AddrPort
	zone             uint16
}

func keyOfFlow(f Flow) fakeKey { return fakeKey{f.Proto, f.OrigSrc, f.OrigDst, f.Zone} }

// Dump returns a copy of Flows.
func (t *FakeTable) Dump(ctx context.Context) ([]Flow, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.DumpErr != nil {
		return nil, t.DumpErr
	}
	return slices.Clone(t.Flows), nil
}

// Delete removes f from Flows, matching on the original tuple and zone as
// the kernel does. The last flow takes the deleted one's place, so deleting
// stays cheap in benchmarks with many flows.
func (t *FakeTable) Delete(ctx context.Context, f Flow) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.DeleteErr != nil {
		return t.DeleteErr
	}
	k := keyOfFlow(f)
	i := t.find(k)
	if i < 0 {
		return fmt.Errorf("delete flow %s: %w", f, ErrNotExist)
	}
	last := len(t.Flows) - 1
	t.Flows[i] = t.Flows[last]
	t.pos[keyOfFlow(t.Flows[i])] = i
	t.Flows = t.Flows[:last]
	delete(t.pos, k)
	t.Deleted = append(t.Deleted, f)
	return nil
}

// find returns the index of the flow with key k in Flows, or -1.
func (t *FakeTable) find(k fakeKey) int {
	if i, ok := t.pos[k]; ok && i < len(t.Flows) && keyOfFlow(t.Flows[i]) == k {
		return i
	}
	// Flows was changed from outside, or k is not there: rebuild.
	t.pos = make(map[fakeKey]int, len(t.Flows))
	for i, g := range t.Flows {
		t.pos[keyOfFlow(g)] = i
	}
	if i, ok := t.pos[k]; ok {
		return i
	}
	return -1
}
