package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// bulkManifests is n ClusterIP services with two endpoints each on pods
// that don't exist, all with targetPort port: two versions differing in
// port have the same chains and sets and differ in every endpoint element.
func bulkManifests(n, port int) string {
	var b strings.Builder
	for i := range n {
		sp := svcSpec{name: fmt.Sprintf("bulk-%d", i), clusterIP: fmt.Sprintf("10.96.%d.%d", 100+i/250, 1+i%250), port: 80, targetPort: port,
			endpoints: []string{fmt.Sprintf("10.244.%d.%d", 100+i/250, 1+i%250), fmt.Sprintf("10.244.%d.%d", 120+i/250, 1+i%250)}}
		b.WriteString(sp.yaml())
		b.WriteString("---\n")
	}
	return b.String()
}

// inSyscall tells whether a thread of process pid is in system call nr
// (x86-64 numbers), as /proc says.
func inSyscall(pid int, nr int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/syscall", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.Fields(string(b) + " x")[0]); err == nil && n == nr {
			return true
		}
	}
	return false
}

const sysSendto = 44 // x86-64

// TestCrashLeavesOldOrNewRuleset SIGKILLs a daemon syncing 2,000 services
// many times: at delays spread over its start-up and first full sync, and
// while it is inside sendto with the batch (mid-batch, seen in /proc). After
// each kill the table holds the ruleset of one manifest version or the
// other, never a mix; a TCP connection established through the ClusterIP
// before the first kill keeps working throughout, and the last restarted
// daemon converges.
func TestCrashLeavesOldOrNewRuleset(t *testing.T) {
	if binary == "" {
		t.Skip("needs root and network namespaces")
	}
	const services = 2000
	s := newScenario(t, 1, webManifests("10.244.1.10"))
	// Longer than the scenario's two minutes: a start-up decodes every service.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	list := func() string {
		out, _ := s.topo.Node.Exec("nft", "list", "table", "ip", "nftproxy")
		return out
	}
	sess, err := s.topo.Client.ConnectTCP(ctx, netip.AddrPort{}, webVIP)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	echo := func(when string) {
		t.Helper()
		if got, err := sess.Echo(ctx, "still there"); err != nil || got != "still there" {
			t.Fatalf("%s: the established connection broke: %q, %v", when, got, err)
		}
	}
	if err := s.d.Stop(); err != nil {
		t.Fatal(err)
	}

	// The two rulesets, each from a daemon that completed its sync.
	versions := []string{bulkManifests(services, 8080), bulkManifests(services, 9090)}
	args := []string{"--manifests", s.dir, "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "", "--metrics-bind-address", "", "--sync-period", "1h", "--conntrack=false"}
	listings := make([]string, 2)
	// The sync window: from the sync loop's start (manifests decoded) to
	// the first sync's end.
	var window time.Duration
	for v := range versions {
		s.write("bulk.yaml", versions[v])
		d, err := Start(s.topo.Node, binary, args...)
		if err != nil {
			t.Fatal(err)
		}
		loopStart := waitLogged(t, ctx, d, "Starting sync loop")
		if err := d.WaitSynced(ctx, 1); err != nil {
			t.Fatal(err)
		}
		window = max(window, time.Since(loopStart))
		listings[v] = list()
		d.Kill()
	}
	if listings[0] == listings[1] {
		t.Fatal("the two versions list the same")
	}
	echo("after the reference runs")
	t.Logf("full sync of %d services (from the sync loop's start): %v", services, window)

	const kills = 12
	midBatch := 0
	for i := range kills {
		v := i % 2
		s.write("bulk.yaml", versions[v])
		d, err := Start(s.topo.Node, binary, args...)
		if err != nil {
			t.Fatal(err)
		}
		// Kills spread over the sync (compile, then the batches); the
		// batch's sendto, when /proc catches the daemon inside it (a
		// thread preempted there), is killed at once.
		waitLogged(t, ctx, d, "Starting sync loop")
		delay := window * time.Duration(i+1) / (kills + 1)
		how := fmt.Sprintf("%v into the sync", delay.Round(time.Millisecond))
		for end := time.Now().Add(delay); time.Now().Before(end); {
			if inSyscall(d.cmd.Process.Pid, sysSendto) {
				how = "inside the batch's sendto"
				break
			}
		}
		d.Kill()
		if how == "inside the batch's sendto" {
			midBatch++
		}
		got := list()
		state := "no table"
		switch got {
		case listings[v]:
			state = fmt.Sprintf("version %d's ruleset, the one it was given", v)
		case listings[1-v]:
			state = fmt.Sprintf("version %d's ruleset, the one before", 1-v)
		default:
			if strings.Contains(got, "table ip nftproxy") {
				t.Fatalf("kill %d (%s): the table is neither version:\n%s", i, how, got)
			}
			t.Fatalf("kill %d (%s): no table left", i, how)
		}
		t.Logf("kill %d %s (synced: %v): %s", i, how, d.Syncs() > 0, state)
		echo(fmt.Sprintf("after kill %d", i))
	}

	// The last restart converges.
	s.write("bulk.yaml", versions[0])
	d, err := Start(s.topo.Node, binary, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop() }()
	if err := d.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != listings[0] {
		t.Errorf("the restarted daemon did not converge:\n%s", got)
	}
	echo("after the restart")
	if _, err := s.topo.Client.AskTCP(ctx, webVIP); err != nil {
		t.Errorf("a new connection after the restart: %v", err)
	}
	t.Logf("%d kills, %d of them inside the batch's sendto", kills, midBatch)
}

// waitLogged waits until the daemon logs msg and returns when it saw it.
func waitLogged(t *testing.T, ctx context.Context, d *Daemon, msg string) time.Time {
	t.Helper()
	for !strings.Contains(d.Log(), `"msg":"`+msg+`"`) {
		if ctx.Err() != nil {
			t.Fatalf("nftproxy never logged %q:\n%s", msg, d.Log())
		}
		time.Sleep(time.Millisecond)
	}
	return time.Now()
}
