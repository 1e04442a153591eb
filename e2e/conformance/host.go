package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kubeletSysctls are the machine-wide settings kubelet's container manager
// writes when it starts (pkg/kubelet/cm, setupKernelTunables). They are not
// per network namespace, so the run records them and puts them back.
var kubeletSysctls = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// savedSysctls holds the values read before the kubelets started.
type savedSysctls map[string]string

func saveSysctls() (savedSysctls, error) {
	s := savedSysctls{}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return nil, fmt.Errorf("read sysctl %s: %w", k, err)
		}
		s[k] = strings.TrimSpace(string(b))
	}
	return s, nil
}

// restore writes back every value that changed and names what it restored.
func (s savedSysctls) restore() ([]string, error) {
	var changed []string
	var errs []error
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if now := strings.TrimSpace(string(b)); now != s[k] {
			if err := os.WriteFile("/proc/sys/"+k, []byte(s[k]), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s: %w", k, err))
				continue
			}
			changed = append(changed, fmt.Sprintf("%s %s→%s", k, now, s[k]))
		}
	}
	return changed, errors.Join(errs...)
}

// cgroupHierarchies are the mounted cgroup hierarchies (one per v1
// controller, the named systemd one, the v2 unified one), where kubelet's
// cgroupfs driver makes the pods' cgroups.
func cgroupHierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			dirs = append(dirs, f[1])
		}
	}
	if len(dirs) == 0 {
		return nil, errors.New("find cgroup hierarchies: none mounted")
	}
	return dirs, nil
}

// makeCgroup creates path (like /nftproxy-conformance-123/node-1) in every
// hierarchy: kubelet requires its --cgroup-root to exist. A v1 cpuset
// cgroup takes no task until it has CPUs and memory nodes, so each level
// gets its parent's.
func makeCgroup(path string) error {
	dirs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		cur := d
		for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
			parent := cur
			cur = filepath.Join(cur, part)
			if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", cur, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					if err := os.WriteFile(filepath.Join(cur, f), v, 0o644); err != nil {
						return fmt.Errorf("set %s of %s: %w", f, cur, err)
					}
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills every process left in root's subtree (containers
// whose shim is gone) and removes the cgroups, deepest first.
func removeCgroupRoot(root string) error {
	dirs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		top := filepath.Join(d, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var all []string
		filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		// Deepest first: a cgroup goes only once its children have.
		slices.SortFunc(all, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, cg := range all {
			if err := emptyCgroup(cg); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func emptyCgroup(cg string) error {
	var err error
	for range 50 {
		b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, e := strconv.Atoi(f); e == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if err = syscall.Rmdir(cg); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", cg, err)
}

// killNamespace kills every process in the named network namespace: the
// containerd shims, which leave their parent, and host-network containers.
func killNamespace(name string) {
	for range 20 {
		out, _ := runOutput("ip", "netns", "pids", name)
		pids := strings.Fields(out)
		if len(pids) == 0 {
			return
		}
		for _, f := range pids {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lockMachine holds a lock for as long as a cluster runs, refusing a second.
func lockMachine() (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "nftproxy-conformance.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open conformance lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock conformance cluster: another one runs on this machine: %w", err)
	}
	return f, nil
}
