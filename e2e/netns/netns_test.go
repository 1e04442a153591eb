package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateDoExecNFT(t *testing.T) {
	n := New(t, "nptest")
	if _, err := os.Stat(runDir + "/" + n.Name()); err != nil {
		t.Fatalf("namespace file missing: %v", err)
	}
	out, err := n.Exec("ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "lo:") || !strings.Contains(out, "UP") {
		t.Errorf("want only lo, up; got:\n%s", out)
	}
	if _, err := n.Exec("false"); err == nil {
		t.Error("Exec(false) returned no error")
	}
	// Do must really switch: the inode of the thread's netns is the namespace's.
	var st, want unixStat
	if err := statFd(n.Fd(), &want); err != nil {
		t.Fatal(err)
	}
	if err := n.Do(func() error { return statPath("/proc/thread-self/ns/net", &st) }); err != nil {
		t.Fatal(err)
	}
	if st != want {
		t.Errorf("Do ran in netns %v, want %v", st, want)
	}
	sentinel := errors.New("from fn")
	if err := n.Do(func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do error = %v, want %v", err, sentinel)
	}
	tables, err := n.Exec("nft", "list", "tables")
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	if strings.TrimSpace(tables) != "" {
		t.Errorf("fresh namespace has tables:\n%s", tables)
	}
}

type unixStat struct{ dev, ino uint64 }

func statFd(fd int, s *unixStat) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	*s = unixStat{st.Dev, st.Ino}
	return nil
}

func statPath(p string, s *unixStat) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	*s = unixStat{st.Dev, st.Ino}
	return nil
}

func TestPidOf(t *testing.T) {
	for _, c := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"np-123-4-abcd", 123, true},
		{"nptopoc-77-1-00ff", 77, true},
		{"my-prefix-9-2-beef", 9, true},
		{"np-123-abcd", 0, false},
		{"np-x-1-abcd", 0, false},
		{"np-12-y-abcd", 0, false},
		{"other", 0, false},
	} {
		pid, ok := pidOf(c.name)
		if pid != c.pid || ok != c.ok {
			t.Errorf("pidOf(%q) = %d, %v; want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
}

func TestCleanupStale(t *testing.T) {
	Require(t)
	// pid_max is at most 2^22, so pid 99999999 never runs. The prefix holds
	// our pid so parallel runs of this test don't clean up each other's.
	prefix := fmt.Sprintf("npst%d", os.Getpid())
	stale := prefix + "-99999999-1-abcd"
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("add stale netns: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = deleteNamed(stale) })
	live := New(t, prefix)
	deleted, err := CleanupStale(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{stale}) {
		t.Errorf("deleted %v, want [%s]", deleted, stale)
	}
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, stale) || !slices.Contains(names, live.Name()) {
		t.Errorf("after cleanup: %v", names)
	}
}
