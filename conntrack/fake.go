package conntrack

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// FakeTable is an in-memory Table for unit tests. Delete removes the flow
// from Flows and appends it to Deleted; deleting a flow that is not in Flows
// returns ErrNotExist, as the kernel does. DumpErr and DeleteErr, when set,
// make every Dump or Delete fail with them.
type FakeTable struct {
	mu        sync.Mutex
	Flows     []Flow
	Deleted   []Flow
	DumpErr   error
	DeleteErr error
}

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
// the kernel does.
func (t *FakeTable) Delete(ctx context.Context, f Flow) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.DeleteErr != nil {
		return t.DeleteErr
	}
	i := slices.IndexFunc(t.Flows, func(g Flow) bool {
		return g.Proto == f.Proto && g.OrigSrc == f.OrigSrc && g.OrigDst == f.OrigDst && g.Zone == f.Zone
	})
	if i < 0 {
		return fmt.Errorf("delete flow %s: %w", f, ErrNotExist)
	}
	t.Flows = slices.Delete(t.Flows, i, i+1)
	t.Deleted = append(t.Deleted, f)
	return nil
}
