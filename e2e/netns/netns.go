package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// runDir is where iproute2 keeps the bind mounts of named namespaces.
const runDir = "/run/netns"

// counter makes names unique inside one process; the pid makes them unique
// across processes and the random suffix guards against pid reuse.
var counter atomic.Uint64

// NS is a named network namespace made with iproute2 (`ip netns add`), so
// nft, ip and conntrack can enter it by name and Go code can enter it by fd.
type NS struct {
	name string
	fd   int

	closeOnce sync.Once
	closeErr  error
}

// Create makes a new named network namespace and brings its loopback up.
// The name is prefix-PID-COUNTER-RANDOM, so parallel runs never collide and
// CleanupStale can tell which process made it.
func Create(prefix string) (*NS, error) {
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("read random suffix: %w", err)
	}
	name := fmt.Sprintf("%s-%d-%d-%s", prefix, os.Getpid(), counter.Add(1), hex.EncodeToString(rnd[:]))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("add netns %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	fd, err := unix.Open(runDir+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = deleteNamed(name)
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	n := &NS{name: name, fd: fd}
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("bring up lo in %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return n, nil
}

// Name is the iproute2 name of the namespace (`ip netns exec NAME ...`).
func (n *NS) Name() string { return n.name }

// Fd is an open file descriptor of the namespace, valid until Close.
func (n *NS) Fd() int { return n.fd }

// String returns the name, so an NS prints well in test failures.
func (n *NS) String() string { return n.name }

// Close deletes the namespace. It kills nothing: sockets the test still holds
// keep the namespace alive in the kernel until they are closed, but the name
// is gone. Calling Close more than once is safe.
func (n *NS) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.fd >= 0 {
			if err := unix.Close(n.fd); err != nil {
				errs = append(errs, fmt.Errorf("close netns fd %s: %w", n.name, err))
			}
			n.fd = -1
		}
		if err := deleteNamed(n.name); err != nil {
			errs = append(errs, err)
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

func deleteNamed(name string) error {
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		return fmt.Errorf("delete netns %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Do runs fn on a locked OS thread switched into the namespace, then switches
// back. Sockets opened by fn stay in the namespace after Do returns.
// Goroutines started by fn do not run in the namespace.
func (n *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", n.name, err)
	}
	fnErr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// The thread is stuck in the test namespace: leave it locked so the
		// runtime ends it when this goroutine exits instead of reusing it.
		return errors.Join(fnErr, fmt.Errorf("return from netns %s: %w", n.name, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// Exec runs `ip netns exec NAME args...` and returns its combined output.
// On failure the error carries the output.
func (n *NS) Exec(args ...string) (string, error) {
	return n.ExecContext(context.Background(), args...)
}

// ExecContext is Exec with a context that kills the command when done.
func (n *NS) ExecContext(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("run %q in %s: %w: %s", strings.Join(args, " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// IP runs `ip -n NAME args...`, which is cheaper than Exec for ip commands.
func (n *NS) IP(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"-n", n.name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("run ip %q in %s: %w: %s", strings.Join(args, " "), n.name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// IPBatch feeds commands (one per line, without the leading "ip") to
// `ip -n NAME -batch -`, one process for many changes.
func (n *NS) IPBatch(cmds ...string) error {
	cmd := exec.Command("ip", "-n", n.name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("run ip batch in %s: %w: %s", n.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Sysctl writes a sysctl such as "net/ipv4/ip_forward" inside the namespace.
func (n *NS) Sysctl(key, value string) error {
	return n.Sysctls(map[string]string{key: value})
}

// Sysctls writes several sysctls inside the namespace in one switch. Keys are
// paths under /proc/sys, which shows the sysctls of the opener's namespace.
func (n *NS) Sysctls(kv map[string]string) error {
	return n.Do(func() error {
		for _, k := range slices.Sorted(maps.Keys(kv)) {
			if err := os.WriteFile("/proc/sys/"+k, []byte(kv[k]), 0); err != nil {
				return fmt.Errorf("write sysctl %s in %s: %w", k, n.name, err)
			}
		}
		return nil
	})
}

// Listen opens a listener whose socket lives in the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in %s: %w", network, addr, n.name, err)
	}
	return l, nil
}

// ListenPacket opens a packet socket (UDP) that lives in the namespace.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen packet %s %s in %s: %w", network, addr, n.name, err)
	}
	return c, nil
}

// Dial connects from the namespace. Use literal addresses: name resolution
// would run in other goroutines, outside the namespace.
func (n *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.DialFrom(ctx, network, "", addr)
}

// DialFrom connects from the namespace with a fixed local address and/or port
// (localAddr "" lets the kernel choose). SO_REUSEADDR is set so a test can
// reuse a source port right after closing the previous connection.
func (n *NS) DialFrom(ctx context.Context, network, localAddr, remoteAddr string) (net.Conn, error) {
	d := net.Dialer{Control: reuseAddr}
	if localAddr != "" {
		var err error
		switch {
		case strings.HasPrefix(network, "tcp"):
			d.LocalAddr, err = net.ResolveTCPAddr(network, localAddr)
		case strings.HasPrefix(network, "udp"):
			d.LocalAddr, err = net.ResolveUDPAddr(network, localAddr)
		default:
			err = fmt.Errorf("network %q has no local address", network)
		}
		if err != nil {
			return nil, fmt.Errorf("resolve local address %s: %w", localAddr, err)
		}
	}
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, remoteAddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s in %s: %w", network, remoteAddr, n.name, err)
	}
	return c, nil
}

func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// WaitRunning waits until every named interface in the namespace is
// operationally up. A veth that was just set up drops what it is given until
// the kernel's link watcher has seen its carrier (asynchronously, late on a
// busy machine), so a first packet sent too early is lost and a test that
// expects an answer within a second fails.
func (n *NS) WaitRunning(ctx context.Context, names ...string) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting []string
		err := n.Do(func() error {
			ifs, err := net.Interfaces()
			if err != nil {
				return fmt.Errorf("list interfaces: %w", err)
			}
			running := map[string]bool{}
			for _, i := range ifs {
				running[i.Name] = i.Flags&net.FlagRunning != 0
			}
			for _, name := range names {
				if !running[name] {
					waiting = append(waiting, name)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %v running in %s: %w", waiting, n.name, ctx.Err())
		case <-tick.C:
		}
	}
}
