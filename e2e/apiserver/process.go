package apiserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// process is one running child: etcd, kube-apiserver or kube-controller-manager.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done is closed
}

// startProcess runs bin with args, appending its stdout and stderr to logPath.
func startProcess(name, bin, logPath string, args []string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "=== %s %s %q\n", time.Now().Format(time.RFC3339Nano), bin, args)

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Kill the child when the test process dies without calling Stop.
		Pdeathsig: syscall.SIGKILL,
		// Keep terminal signals (Ctrl-C on go test) for the test process to handle.
		Setpgid: true,
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}

	// Pdeathsig fires when the OS thread that forked the child exits, not the
	// process, so fork from a thread locked for the child's whole life.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is never unlocked: the runtime ends it with this goroutine,
		// which is after the child has exited.
		if err := cmd.Start(); err != nil {
			logFile.Close()
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// exited reports whether the process has ended, with the reason.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.waitErr == nil {
			return true, errors.New("exited with status 0")
		}
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM and, when the process is still there after grace, SIGKILL.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	// A paused process acts on SIGTERM only once it runs again.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(grace):
		// Setpgid made the child a group leader: take any helpers it forked along.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// signal delivers sig unless the process has already exited.
func (p *process) signal(sig syscall.Signal) error {
	if done, err := p.exited(); done {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// waitStopped waits until every thread of the process is stopped (state T
// in /proc), as it is some time after SIGSTOP.
func (p *process) waitStopped(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	tasks := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	for {
		running, err := runningThreads(tasks)
		if err != nil {
			return fmt.Errorf("wait for %s to stop: %w", p.name, err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for %s to stop: %d threads still running after %s", p.name, running, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runningThreads counts the threads under a /proc/<pid>/task directory
// whose state is not stopped.
func runningThreads(tasks string) (int, error) {
	ents, err := os.ReadDir(tasks)
	if err != nil {
		return 0, err
	}
	running := 0
	for _, e := range ents {
		stat, err := os.ReadFile(tasks + "/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses
		// and may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			return 0, fmt.Errorf("parse %s/%s/stat", tasks, e.Name())
		}
		if stat[i+2] != 'T' && stat[i+2] != 't' {
			running++
		}
	}
	return running, nil
}

// logTailBytes bounds how much of a log an error message carries.
const logTailBytes = 3000

// tail returns the end of the process's log for error messages.
func (p *process) tail() string {
	return tailFile(p.logPath, logTailBytes)
}

// tailFile returns at most n bytes from the end of path, starting at a line boundary.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	off := max(st.Size()-n, 0)
	buf, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	if off > 0 {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	return string(buf)
}
