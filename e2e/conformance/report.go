package conformance

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
)

// Run is one proxy's pass over the suite.
type Run struct {
	Proxy    string
	Results  []Result
	Duration time.Duration
	Err      error
}

// Markdown renders docs/conformance.md: every test of the focus, with its
// result under each proxy, the reason for every skip, and the totals.
func Markdown(runs []Run, focus, skip string, when time.Time, setup string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kubernetes' e2e Services tests on real nodes\n\n")
	fmt.Fprintf(&b, "Written by `make conformance` (e2e/conformance) on %s. %s\n\n", when.UTC().Format("2006-01-02 15:04 UTC"), setup)
	fmt.Fprintf(&b, "Focus `%s`, skip `%s`.\n\n", focus, skip)
	byName := map[string]map[string]Result{}
	for _, r := range runs {
		for _, res := range r.Results {
			if byName[res.Name] == nil {
				byName[res.Name] = map[string]Result{}
			}
			byName[res.Name][r.Proxy] = res
		}
	}
	totals := &e2e.Table{Head: []string{"proxy", "passed", "failed", "skipped", "not reached", "time"}}
	for _, r := range runs {
		n := map[string]int{}
		for _, res := range r.Results {
			n[res.State]++
		}
		errNote := ""
		if r.Err != nil {
			errNote = " (ended early: below)"
		}
		totals.Rows = append(totals.Rows, []string{r.Proxy, fmt.Sprint(n["passed"]), fmt.Sprint(n["failed"]), fmt.Sprint(n["skipped"]),
			fmt.Sprint(n[notReached]), r.Duration.Round(time.Second).String() + errNote})
	}
	totals.Write(&b)
	for _, r := range runs {
		if r.Err != nil {
			fmt.Fprintf(&b, "%s ended early:\n\n```\n%s\n```\n\n", r.Proxy, strings.TrimSpace(r.Err.Error()))
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	tests := &e2e.Table{Head: []string{"test"}}
	for _, r := range runs {
		tests.Head = append(tests.Head, r.Proxy)
	}
	tests.Head = append(tests.Head, "reason (skip or failure)")
	for _, n := range names {
		row := []string{escape(n)}
		var reasons []string
		for _, r := range runs {
			res, ok := byName[n][r.Proxy]
			if !ok {
				row = append(row, "not run")
				continue
			}
			row = append(row, res.State)
			if res.Reason != "" && res.State != "passed" {
				reasons = append(reasons, r.Proxy+": "+res.Reason)
			}
		}
		tests.Rows = append(tests.Rows, append(row, escape(strings.Join(dedupe(reasons), "; "))))
	}
	tests.Write(&b)
	// The page ends with the table, not a blank line.
	return strings.TrimSuffix(b.String(), "\n")
}

// notReached is the state of a spec the suite's timeout cut off: ginkgo
// reports it as skipped with no reason, as it does a spec the skip filter
// left out, so the filter tells the two apart.
const notReached = "not reached"

// explainSkips names the reason of every skip ginkgo gave none: the skip
// filter, else the suite ended before the spec ran.
func explainSkips(results []Result, skip string) []Result {
	re := regexp.MustCompile(skip)
	out := make([]Result, len(results))
	for i, r := range results {
		if r.State == "skipped" && r.Reason == "skipped" {
			if re.MatchString(r.Name) {
				r.Reason = "skipped - matches the skip filter"
			} else {
				r.State, r.Reason = notReached, "the suite's timeout ended the run before it"
			}
		}
		out[i] = r
	}
	return out
}

// inFocus keeps the results whose name the focus selects (the report also
// lists every spec the filter left out).
func inFocus(results []Result, focus string) []Result {
	re := regexp.MustCompile(focus)
	var out []Result
	for _, r := range results {
		if re.MatchString(r.Name) {
			out = append(out, r)
		}
	}
	return out
}

func escape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// dedupe merges reasons that are the same for both proxies.
func dedupe(reasons []string) []string {
	if len(reasons) == 2 {
		a := reasons[0][strings.Index(reasons[0], ": ")+2:]
		b := reasons[1][strings.Index(reasons[1], ": ")+2:]
		if a == b {
			return []string{"both: " + a}
		}
	}
	return reasons
}
