package conformance

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Focus and Skip are the suite's selection: the Services tests, the
// Networking and Conntrack tests beside them. Skipped: what disrupts nodes
// or needs the whole cluster (Disruptive, Serial); "Internet connection",
// since the namespaces have no route off the machine (the network-safety
// rule); IPerf2, a benchmark; SCTP, as the nodes do not load sctp.
const (
	Focus = `\[sig-network\] (Services|Networking|Conntrack)`
	Skip  = `Disruptive|\[Serial\]|Internet connection|IPerf2|sctp|SCTP`
)

// Result is one test's outcome.
type Result struct {
	Name   string
	State  string // passed, failed, skipped, or notReached
	Reason string // a skip's or failure's message, first line
	Time   time.Duration
}

// RunSuite runs e2e.test from the fabric namespace against the cluster and
// returns every test of the focus with its result.
func (c *Cluster) RunSuite(ctx context.Context, focus, skip string, timeout time.Duration) ([]Result, error) {
	report := filepath.Join(c.Dir, "report-"+c.opts.Proxy.Name)
	if err := os.MkdirAll(report, 0o755); err != nil {
		return nil, err
	}
	e2eFlags := []string{"--kubeconfig=" + c.FabricKubeconfig, "--provider=local",
		"--kubectl-path=" + filepath.Join(c.opts.Bins, "kubectl"),
		"--report-dir=" + report, "--dump-logs-on-failure=false",
		// Without it the framework counts -1 nodes and skips every spec
		// that needs two ("Requires at least 2 nodes (not -1)").
		fmt.Sprintf("--num-nodes=%d", len(c.Topo.Nodes))}
	ginkgoFlags := []string{"focus=" + focus, "skip=" + skip, "timeout=" + timeout.String(), "no-color",
		"junit-report=" + filepath.Join(report, "junit.xml")}
	args := []string{"netns", "exec", c.Topo.Fabric.Name()}
	if c.opts.Procs > 1 {
		if _, err := os.Stat(filepath.Join(c.opts.Bins, "ginkgo")); err != nil {
			return nil, fmt.Errorf("run e2e.test in %d processes: %w (e2e/conformance/build.sh builds the ginkgo CLI)", c.opts.Procs, err)
		}
		// The CLI starts the processes and merges their reports.
		args = append(args, filepath.Join(c.opts.Bins, "ginkgo"), fmt.Sprintf("--procs=%d", c.opts.Procs))
		for _, f := range ginkgoFlags {
			args = append(args, "--"+f)
		}
		args = append(append(args, filepath.Join(c.opts.Bins, "e2e.test"), "--"), e2eFlags...)
	} else {
		args = append(append(args, filepath.Join(c.opts.Bins, "e2e.test")), e2eFlags...)
		for _, f := range ginkgoFlags {
			args = append(args, "--ginkgo."+f)
		}
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	log, err := os.Create(filepath.Join(c.Dir, "e2e-"+c.opts.Proxy.Name+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run()
	results, err := readJUnit(filepath.Join(report, "junit.xml"))
	if err != nil {
		return nil, fmt.Errorf("run e2e.test (%v): %w; log %s", runErr, err, log.Name())
	}
	return results, nil
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func readJUnit(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	var out []Result
	for _, su := range s.Suites {
		for _, tc := range su.Cases {
			r := Result{Name: strings.TrimPrefix(tc.Name, "[It] "), State: tc.Status, Time: time.Duration(tc.Time * float64(time.Second))}
			switch {
			case tc.Failure != nil:
				r.Reason = tc.Failure.Message
			case tc.Skipped != nil:
				r.Reason = tc.Skipped.Message
			}
			if i := strings.IndexByte(r.Reason, '\n'); i >= 0 {
				r.Reason = r.Reason[:i]
			}
			// The suite's set-up and tear-down nodes are not tests.
			if strings.HasPrefix(tc.Name, "[SynchronizedBeforeSuite]") || strings.HasPrefix(tc.Name, "[SynchronizedAfterSuite]") ||
				strings.HasPrefix(tc.Name, "[ReportAfterSuite]") || strings.HasPrefix(tc.Name, "[ReportBeforeSuite]") {
				continue
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
