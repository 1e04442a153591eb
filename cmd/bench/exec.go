package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// nsPrefix starts the names of the benchmark's namespaces, so a killed run's
// leftovers are found by netns.CleanupStale.
const nsPrefix = "npb"

// toolTimeout bounds one run of an external tool; the slow ones are capped
// by size beforehand, this only keeps a surprise from hanging the run.
const toolTimeout = 5 * time.Minute

// toolRun is what one run of a tool left: how long it took, process
// start-up and exit included (what a proxy that shells out pays), its
// standard output and its user and system CPU.
type toolRun struct {
	took, cpu time.Duration
	out       []byte
}

// runTool runs a tool inside ns with input on its standard input and env
// added to its environment. The child is forked from a thread switched into
// the namespace, which costs less than `ip netns exec` and adds nothing to
// the measurement.
func runTool(ns *netns.NS, input string, env []string, args ...string) (toolRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Env = strings.NewReader(input), append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	var start time.Time
	err := ns.Do(func() error {
		start = time.Now()
		return cmd.Start()
	})
	if err != nil {
		return toolRun{}, fmt.Errorf("start %s: %w", args[0], err)
	}
	err = cmd.Wait()
	run := toolRun{took: time.Since(start), out: out.Bytes()}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return run, fmt.Errorf("run %s: timed out after %s", args[0], toolTimeout)
	}
	if err != nil {
		return run, fmt.Errorf("run %s: %w: %s", args[0], err, firstLines(errOut.String()+out.String(), 5))
	}
	run.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return run, nil
}

// timeTool is runTool for the time alone.
func timeTool(ns *netns.NS, input string, args ...string) (time.Duration, error) {
	run, err := runTool(ns, input, nil, args...)
	return run.took, err
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}

// repeat times runs of one step, in milliseconds, and stops at the first
// error: every full-sync and update figure is such a list.
func repeat(runs int, step func(run int) (time.Duration, error)) ([]float64, error) {
	var out []float64
	for run := range runs {
		d, err := step(run)
		if err != nil {
			return out, err
		}
		out = append(out, ms(d))
	}
	return out, nil
}

// loadFresh times runs of a tool loading text into a fresh namespace each,
// and records them as the full sync of n services by method.
func loadFresh(res *Results, n, runs int, method, text string, args ...string) error {
	took, err := repeat(runs, func(int) (d time.Duration, err error) {
		err = freshNS(func(ns *netns.NS) error {
			d, err = timeTool(ns, text, args...)
			return err
		})
		return d, err
	})
	if err != nil {
		return err
	}
	res.add(n, metricFullSync, method, took...)
	return nil
}

// freshNS runs fn in a new namespace and removes the namespace afterwards.
func freshNS(fn func(ns *netns.NS) error) error {
	ns, err := netns.Create(nsPrefix)
	if err != nil {
		return err
	}
	err = fn(ns)
	if cerr := ns.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// logf prints progress on standard error.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
