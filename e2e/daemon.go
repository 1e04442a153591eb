package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Build compiles cmd/nftproxy into dir and returns the binary's path.
func Build(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	out := filepath.Join(dir, "nftproxy")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/nftproxy")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nftproxy: %w: %s", err, b)
	}
	return out, nil
}

// RunTests is a TestMain for the kernel tiers: unless -short or the machine
// can't make network namespaces, it builds nftproxy into a temporary
// directory and sets *binary to its path (else leaves it empty, and the tests
// skip), then runs the tests. It returns the exit code.
func RunTests(m *testing.M, binary *string) int {
	flag.Parse()
	if !testing.Short() && netns.Usable() == "" { // -short first: the probe makes a namespace
		dir, err := os.MkdirTemp("", "nftproxy-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if *binary, err = Build(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// Daemon is an nftproxy process running inside a network namespace.
type Daemon struct {
	ns   *netns.NS
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	log bytes.Buffer
}

// Start runs `nftproxy run args...` inside ns (through `ip netns exec`).
func Start(ns *netns.NS, binary string, args ...string) (*Daemon, error) {
	return StartWithEnv(ns, nil, binary, args...)
}

// StartWithEnv is Start with the daemon's environment env (nil: the test's).
func StartWithEnv(ns *netns.NS, env []string, binary string, args ...string) (*Daemon, error) {
	return startCommand(ns, env, binary, append([]string{"run"}, args...)...)
}

// StartCommand runs any program inside ns (the reference kube-proxy, or
// nftproxy with a subcommand of its own), collecting its log like Start.
func StartCommand(ns *netns.NS, binary string, args ...string) (*Daemon, error) {
	return startCommand(ns, nil, binary, args...)
}

func startCommand(ns *netns.NS, env []string, binary string, args ...string) (*Daemon, error) {
	d := &Daemon{ns: ns, done: make(chan struct{})}
	d.cmd = exec.Command("ip", append([]string{"netns", "exec", ns.Name(), binary}, args...)...)
	d.cmd.Env = env
	d.cmd.Stdout = d
	d.cmd.Stderr = d
	// The daemon must not outlive the test or demo that started it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	return d, nil
}

// Write collects the daemon's log.
func (d *Daemon) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.Write(p)
}

// Log returns what the daemon has logged so far.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// LogTail is the last n lines of the daemon's log, for an error message.
func (d *Daemon) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(d.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitSynced waits until the daemon has logged n successful syncs in all.
func (d *Daemon) WaitSynced(ctx context.Context, n int) error {
	for {
		if c := strings.Count(d.Log(), `"msg":"Synced"`); c >= n {
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("wait for sync: nftproxy exited: %s", d.Log())
		case <-ctx.Done():
			return fmt.Errorf("wait for sync %d: %w; log:\n%s", n, ctx.Err(), d.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Syncs counts the successful syncs logged so far.
func (d *Daemon) Syncs() int { return strings.Count(d.Log(), `"msg":"Synced"`) }

// ResyncsSkipped counts the periodic full syncs the daemon skipped because
// nothing committed to nftables since its last sync (logged with -v 2).
func (d *Daemon) ResyncsSkipped() int {
	return strings.Count(d.Log(), `"msg":"Resync skipped`)
}

// Stop sends SIGTERM and waits for the process to exit; after five seconds
// it is made to dump its goroutines and killed.
func (d *Daemon) Stop() error {
	select {
	case <-d.done:
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		// SIGQUIT makes the Go runtime print every goroutine's stack into
		// the log before it exits: what the daemon was blocked on.
		_ = d.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-d.done:
		case <-time.After(2 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		return errors.New("stop nftproxy: not stopped 5s after SIGTERM (goroutine dump in its log)")
	}
	return nil
}

// Kill ends the process at once, as a crash would.
func (d *Daemon) Kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

// Exited reports whether the process has ended.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// Terminate sends SIGTERM and kills the process if it is still there after
// grace: for programs other than nftproxy, whose shutdown takes its time.
func (d *Daemon) Terminate(grace time.Duration) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
		d.Kill()
	}
}
