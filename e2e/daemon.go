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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	// This file is e2e/daemon.go.
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Build compiles cmd/nftproxy into dir and returns the binary's path.
func Build(dir string) (string, error) {
	out := filepath.Join(dir, "nftproxy")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/nftproxy")
	cmd.Dir = RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nftproxy: %w: %s", err, b)
	}
	return out, nil
}

// BuildImage runs `make image` into dir with the given make variables
// (VERSION=..., IMAGE_NAME=...) and returns the OCI archive it wrote.
func BuildImage(dir string, vars ...string) (string, error) {
	cmd := exec.Command("make", append([]string{"-C", RepoRoot(), "image", "BIN=" + dir}, vars...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make image: %w: %s", err, b)
	}
	return filepath.Join(dir, "nftproxy-image.tar"), nil
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

// StartCommandWithEnv is StartCommand with the program's environment env
// (nil: the caller's): kube-proxy with an iptables backend first on its
// PATH, say.
func StartCommandWithEnv(ns *netns.NS, env []string, binary string, args ...string) (*Daemon, error) {
	return startCommand(ns, env, binary, args...)
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

// Lines of nftproxy's JSON log that the tests and the bench count: a
// successful sync, and a periodic full sync skipped because nothing
// committed to nftables since the last one (logged with -v 2).
const (
	SyncedLine        = `"msg":"Synced"`
	ResyncSkippedLine = `"msg":"Resync skipped`
)

// WaitSynced waits until the daemon has logged n successful syncs in all.
func (d *Daemon) WaitSynced(ctx context.Context, n int) error {
	for {
		if c := strings.Count(d.Log(), SyncedLine); c >= n {
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
func (d *Daemon) Syncs() int { return strings.Count(d.Log(), SyncedLine) }

// ResyncsSkipped counts the periodic full syncs the daemon skipped.
func (d *Daemon) ResyncsSkipped() int { return strings.Count(d.Log(), ResyncSkippedLine) }

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

// Pid is the program's process id: `ip netns exec` execs it in place.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Memory returns the program's resident memory (VmRSS) and its peak
// (VmHWM), in MiB.
func (d *Daemon) Memory() (rss, peak float64, err error) {
	st, err := ProcStatus(d.Pid())
	if err != nil {
		return 0, 0, err
	}
	return float64(st["VmRSS"]) / 1024, float64(st["VmHWM"]) / 1024, nil
}

// ProcStatus reads the kB fields of a process's /proc/PID/status (VmRSS,
// VmHWM…).
func ProcStatus(pid int) (map[string]int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("read process status: %w", err)
	}
	out := map[string]int{}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(line, ":")
		if v, unit := strings.CutSuffix(strings.TrimSpace(v), " kB"); ok && unit {
			if n, err := strconv.Atoi(v); err == nil {
				out[k] = n
			}
		}
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, errors.New("read process status: no VmRSS")
	}
	return out, nil
}

// IptablesTools fills dir with iptables, iptables-save, iptables-restore
// and their ip6tables twins linked to backend's ("nft" or "legacy"), and
// nft: with dir first on its PATH, kube-proxy's iptables mode uses that
// backend, as it picks the iptables its PATH finds.
func IptablesTools(dir, backend string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make iptables directory: %w", err)
	}
	link := func(name, tool string) error {
		target, err := exec.LookPath(tool)
		if err != nil {
			return fmt.Errorf("find %s (apt-get install iptables nftables): %w", tool, err)
		}
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		return nil
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			if err := link(fam+suffix, fam+"-"+backend+suffix); err != nil {
				return err
			}
		}
	}
	return link("nft", "nft")
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
