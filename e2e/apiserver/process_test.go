package apiserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestTailFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		content string // "" means no file
		n       int64
		want    string
	}{
		{name: "short log whole", content: "a\nb\n", n: 100, want: "a\nb\n"},
		{name: "cut starts at a line", content: "first line\nsecond\nthird\n", n: 10, want: "third\n"},
		{name: "missing log", n: 100, want: "(no log: "},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, string(rune('a'+i)))
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := tailFile(path, tc.n); !strings.HasPrefix(got, tc.want) {
				t.Errorf("tailFile = %q, want prefix %q", got, tc.want)
			}
		})
	}
}

func TestProcessExitAndStop(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		script   string
		stop     bool
		wantLog  string // computed by the script, so the logged command line never matches it
		wantExit string
	}{
		{name: "exits by itself", script: "echo started-$((1+1)); exit 3", wantLog: "started-2", wantExit: "exit status 3"},
		{name: "stopped by SIGTERM", script: "echo waiting-$((1+1)); exec sleep 60", stop: true, wantLog: "waiting-2", wantExit: "signal: terminated"},
		{name: "ignores SIGTERM", script: "trap '' TERM; echo stubborn-$((1+1)); sleep 60", stop: true, wantLog: "stubborn-2", wantExit: "signal: killed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".log")
			p, err := startProcess("sh", "/bin/sh", log, []string{"-c", tc.script})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.stop(0) })
			// Let the script print and install its trap before signalling it.
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(p.tail(), tc.wantLog) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if tc.stop {
				p.stop(200 * time.Millisecond)
			}
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				t.Fatal("process still running")
			}
			_, err = p.exited()
			if err == nil || err.Error() != tc.wantExit {
				t.Errorf("exit: %v, want %s", err, tc.wantExit)
			}
			if !strings.Contains(p.tail(), tc.wantLog) {
				t.Errorf("log %q does not contain %q", p.tail(), tc.wantLog)
			}
		})
	}
}

func TestRemoveStaleDirs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	self := strconv.Itoa(os.Getpid())
	tests := []struct {
		name     string
		wantKept bool
	}{
		{name: dirPrefix + self + "-123", wantKept: true},
		// PIDs are below 2^22 on Linux, so this owner cannot be alive.
		{name: dirPrefix + "99999999-123", wantKept: false},
		{name: dirPrefix + "notapid-123", wantKept: true},
		{name: "other-99999999-123", wantKept: true},
	}
	for _, tc := range tests {
		if err := os.Mkdir(filepath.Join(tmp, tc.name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removeStaleDirs()
	for _, tc := range tests {
		_, err := os.Stat(filepath.Join(tmp, tc.name))
		if kept := err == nil; kept != tc.wantKept {
			t.Errorf("%s: kept=%v, want %v", tc.name, kept, tc.wantKept)
		}
	}
}

// TestWaitStopped stops a busy child, as PauseAPIServer does, and checks that
// waitStopped finds every thread stopped and that it runs again after SIGCONT.
func TestWaitStopped(t *testing.T) {
	log := filepath.Join(t.TempDir(), "busy.log")
	p, err := startProcess("sh", "/bin/sh", log, []string{"-c", "while :; do :; done"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.signal(syscall.SIGCONT); p.stop(0) })
	tasks := "/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/task"
	if n, err := runningThreads(tasks); err != nil || n == 0 {
		t.Fatalf("before SIGSTOP: %d running threads (%v), want some", n, err)
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := p.waitStopped(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := runningThreads(tasks); err != nil || n != 0 {
		t.Fatalf("after waitStopped: %d running threads (%v), want none", n, err)
	}
	if err := p.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := runningThreads(tasks); n == 0; n, _ = runningThreads(tasks) {
		if time.Now().After(deadline) {
			t.Fatal("still stopped 5s after SIGCONT")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
