package features

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// PrivateNetns makes a new, empty network namespace and returns a
// descriptor of it for NewProber; the caller closes it, and the namespace
// goes with it. The features are the kernel's, the same in every
// namespace, but a probe's throwaway tables are live while they exist:
// probed in the namespace traffic flows through, their base chains see its
// packets, and a restarting daemon's probes were seen to break a connection
// opened just then. Making a namespace needs CAP_SYS_ADMIN.
func PrivateNetns() (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("open network namespace: %w", err)}
			return
		}
		defer func() { _ = unix.Close(orig) }()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, fmt.Errorf("make network namespace: %w", err)}
			return
		}
		fd, openErr := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		// Back where it was: the thread may be the process's first, whose
		// namespace /proc/self/net shows.
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Left locked, the thread ends with this goroutine instead
			// of being reused in the wrong namespace.
			if openErr == nil {
				_ = unix.Close(fd)
			}
			done <- result{-1, fmt.Errorf("return to network namespace: %w", err)}
			return
		}
		runtime.UnlockOSThread()
		if openErr != nil {
			done <- result{-1, fmt.Errorf("open new network namespace: %w", openErr)}
			return
		}
		done <- result{fd, nil}
	}()
	r := <-done
	return r.fd, r.err
}
