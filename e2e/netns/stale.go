package netns

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// List returns the names of all named namespaces (what `ip netns list` shows).
func List() ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", runDir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// CleanupStale deletes namespaces whose name starts with prefix and whose
// creating process (the pid in the name) is gone, left over by killed runs.
// It returns the names it deleted.
func CleanupStale(prefix string) ([]string, error) {
	names, err := List()
	if err != nil {
		return nil, err
	}
	var deleted []string
	var errs []error
	for _, name := range names {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		pid, ok := pidOf(name)
		if !ok || pid == os.Getpid() || alive(pid) {
			continue
		}
		if err := deleteNamed(name); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, name)
	}
	return deleted, errors.Join(errs...)
}

// pidOf parses the pid out of a name made by Create: PREFIX-PID-COUNTER-RANDOM.
func pidOf(name string) (int, bool) {
	parts := strings.Split(name, "-")
	if len(parts) < 4 {
		return 0, false
	}
	pid, err := strconv.Atoi(parts[len(parts)-3])
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := strconv.ParseUint(parts[len(parts)-2], 10, 64); err != nil {
		return 0, false
	}
	return pid, true
}

func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
