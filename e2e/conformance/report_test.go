package conformance

import "testing"

// TestExplainSkips: ginkgo gives a filtered spec and a spec the suite's
// timeout cut off the same bare "skipped"; the report must not count the
// second as a skip.
func TestExplainSkips(t *testing.T) {
	for _, tc := range []struct {
		name, state, reason   string
		wantState, wantReason string
	}{
		{"[sig-network] Services should serve [Serial]", "skipped", "skipped", "skipped", "skipped - matches the skip filter"},
		{"[sig-network] Services should serve a basic endpoint", "skipped", "skipped", notReached, "the suite's timeout ended the run before it"},
		{"[sig-network] Services needs nodes", "skipped", "skipped - Requires at least 2 nodes", "skipped", "skipped - Requires at least 2 nodes"},
		{"[sig-network] Services passes", "passed", "", "passed", ""},
	} {
		got := explainSkips([]Result{{Name: tc.name, State: tc.state, Reason: tc.reason}}, Skip)[0]
		if got.State != tc.wantState || got.Reason != tc.wantReason {
			t.Errorf("%s: got %s (%q), want %s (%q)", tc.name, got.State, got.Reason, tc.wantState, tc.wantReason)
		}
	}
}
