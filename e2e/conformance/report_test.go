package conformance

import (
	"errors"
	"testing"
	"time"
)

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

// TestMarkdown pins the report's text: totals per proxy, a run that ended
// early, and a row per test with each proxy's state and the reasons.
func TestMarkdown(t *testing.T) {
	runs := []Run{
		{Proxy: "nftproxy", Duration: 61 * time.Second, Results: []Result{
			{Name: "[sig-network] Services b", State: "passed"},
			{Name: "[sig-network] Services a | pipe", State: "skipped", Reason: "skipped - matches the skip filter"},
			{Name: "[sig-network] Services c", State: "failed", Reason: "timed out"},
		}},
		{Proxy: "kube-proxy", Duration: 59 * time.Second, Err: errors.New("suite ended\n"), Results: []Result{
			{Name: "[sig-network] Services b", State: "passed"},
			{Name: "[sig-network] Services a | pipe", State: "skipped", Reason: "skipped - matches the skip filter"},
		}},
	}
	got := Markdown(runs, "focus", "skip", time.Date(2026, 12, 8, 2, 30, 0, 0, time.UTC), "Setup.")
	want := "# Kubernetes' e2e Services tests on real nodes\n" +
		"\n" +
		"Written by `make conformance` (e2e/conformance) on 2026-12-08 02:30 UTC. Setup.\n" +
		"\n" +
		"Focus `focus`, skip `skip`.\n" +
		"\n" +
		"| proxy | passed | failed | skipped | not reached | time |\n" +
		"|---|---|---|---|---|---|\n" +
		"| nftproxy | 1 | 1 | 1 | 0 | 1m1s |\n" +
		"| kube-proxy | 1 | 0 | 1 | 0 | 59s (ended early: below) |\n" +
		"\n" +
		"kube-proxy ended early:\n" +
		"\n" +
		"```\n" +
		"suite ended\n" +
		"```\n" +
		"\n" +
		"| test | nftproxy | kube-proxy | reason (skip or failure) |\n" +
		"|---|---|---|---|\n" +
		"| [sig-network] Services a \\| pipe | skipped | skipped | both: skipped - matches the skip filter |\n" +
		"| [sig-network] Services b | passed | passed |  |\n" +
		"| [sig-network] Services c | failed | not run | nftproxy: timed out |\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
