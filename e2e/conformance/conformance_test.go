package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// enabled is the variable `make conformance` sets; without it the tests skip
// (make test does not run them: they take most of an hour).
const enabled = "NFTPROXY_CONFORMANCE"

func bins(t *testing.T) string {
	t.Helper()
	if os.Getenv(enabled) == "" {
		t.Skipf("set %s=1 (make conformance) to run the real-node cluster", enabled)
	}
	netns.Require(t)
	dir := os.Getenv("NFTPROXY_CONFORMANCE_BIN")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "nftproxy", "conformance-v1.36.3")
	}
	for _, f := range []string{"kubelet", "kube-scheduler", "kubectl", "e2e.test", "images/pause.tar", "images/agnhost.tar", "images/coredns.tar", "images/regression-issue-74839.tar"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%v: run e2e/conformance/build.sh (make conformance does)", err)
		}
	}
	// The node's runtime comes from Debian (make conformance installs it).
	for _, tool := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%v: apt-get install containerd runc containernetworking-plugins (make conformance does)", err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Fatalf("%v: apt-get install containernetworking-plugins (make conformance does)", err)
	}
	return dir
}

func nftproxyBinary(t *testing.T) string {
	t.Helper()
	bin, err := e2e.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestNodeSmoke is the cluster's own check: pods a kubelet started reach
// each other through a ClusterIP Service that nftproxy programmed.
func TestNodeSmoke(t *testing.T) {
	b := bins(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	proxy := NFTProxy(nftproxyBinary(t))
	// CONFORMANCE_PROXY=kube-proxy runs the smoke on the reference instead.
	if os.Getenv("CONFORMANCE_PROXY") == "kube-proxy" {
		proxy = KubeProxy()
	}
	c, err := Start(ctx, Options{Bins: b, Proxy: proxy, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", c.ProxyLogs())
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	checkEchoService(ctx, t, c)
}

// checkEchoService serves agnhost behind a ClusterIP Service on two pods and
// has a third pod reach it by name: pod to Service, through CoreDNS, over the
// proxy's rules.
func checkEchoService(ctx context.Context, t *testing.T, c *Cluster) {
	t.Helper()
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	kubectl("create", "deployment", "echo", "--image=registry.k8s.io/e2e-test-images/agnhost:2.63.0", "--replicas=2", "--", "/agnhost", "netexec", "--http-port=8080")
	kubectl("patch", "deployment", "echo", "--type=json", `-p=[{"op":"add","path":"/spec/template/spec/containers/0/imagePullPolicy","value":"Never"}]`)
	kubectl("expose", "deployment", "echo", "--port=80", "--target-port=8080")
	kubectl("rollout", "status", "deployment/echo", "--timeout=3m")
	kubectl("run", "client", "--image=registry.k8s.io/e2e-test-images/agnhost:2.63.0", "--image-pull-policy=Never", "--command", "--", "sleep", "3600")
	kubectl("wait", "pod/client", "--for=condition=Ready", "--timeout=2m")
	var out string
	err := retry(ctx, time.Minute, func() error {
		var err error
		out, err = c.Kubectl(ctx, "exec", "client", "--", "curl", "-sS", "--max-time", "3", "http://echo.default.svc.cluster.local/hostname")
		return err
	})
	if err != nil {
		t.Fatalf("a pod reaching the echo Service by name: %v", err)
	}
	if !strings.HasPrefix(strings.TrimSpace(out), "echo-") {
		t.Fatalf("echo Service answered %q, want a pod's hostname", out)
	}
	t.Logf("pod client reached echo: %s", out)
}

// TestConformance runs the focus with nftproxy on every node, then with the
// reference kube-proxy in nftables mode on fresh nodes, and writes both
// results to docs/conformance.md. nftproxy must pass whatever kube-proxy
// passes.
func TestConformance(t *testing.T) {
	b := bins(t)
	focus := envOr("CONFORMANCE_FOCUS", Focus)
	skip := envOr("CONFORMANCE_SKIP", Skip)
	budget, err := time.ParseDuration(envOr("CONFORMANCE_SUITE_TIMEOUT", "25m"))
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := strconv.Atoi(envOr("CONFORMANCE_NODES", "3"))
	if err != nil {
		t.Fatalf("CONFORMANCE_NODES: %v", err)
	}
	procs, err := strconv.Atoi(envOr("CONFORMANCE_PROCS", "3"))
	if err != nil {
		t.Fatalf("CONFORMANCE_PROCS: %v", err)
	}
	var runs []Run
	for _, p := range []Proxy{NFTProxy(nftproxyBinary(t)), KubeProxy()} {
		start := time.Now()
		run := Run{Proxy: p.Name}
		ctx, cancel := context.WithTimeout(t.Context(), budget+10*time.Minute)
		c, err := Start(ctx, Options{Bins: b, Proxy: p, Nodes: nodes, Procs: procs, Logf: t.Logf})
		if err != nil {
			// The report says why this proxy has no results; the other
			// proxy still runs.
			run.Err, run.Duration = fmt.Errorf("start cluster: %w", err), time.Since(start)
			t.Errorf("%s: %v", p.Name, run.Err)
		} else {
			t.Logf("%s: cluster up in %s; running e2e.test", p.Name, time.Since(start).Round(time.Second))
			res, err := c.RunSuite(ctx, focus, skip, budget)
			run.Results, run.Err, run.Duration = explainSkips(inFocus(res, focus), skip), err, time.Since(start)
			if err != nil {
				t.Errorf("%s: %v", p.Name, err)
			}
		}
		if c != nil {
			if err := c.Close(); err != nil {
				t.Errorf("close %s cluster: %v", p.Name, err)
			}
		}
		cancel()
		runs = append(runs, run)
	}
	doc := Markdown(runs, focus, skip, time.Now(), fmt.Sprintf("%d nodes, each a network namespace running containerd %s, kubelet v1.36.3 and the proxy; API server, controller manager and scheduler v1.36.3.", nodes, containerdVersion()))
	if err := os.WriteFile(filepath.Join(sourceDir(), "..", "..", "docs", "conformance.md"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	// What kube-proxy passes, nftproxy must pass.
	ours := map[string]string{}
	for _, r := range runs[0].Results {
		ours[r.Name] = r.State
	}
	for _, r := range runs[1].Results {
		if r.State == "passed" && ours[r.Name] != "passed" {
			t.Errorf("kube-proxy passes, nftproxy %s: %s", ours[r.Name], r.Name)
		}
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func containerdVersion() string {
	out, err := runOutput("containerd", "--version")
	if err != nil {
		return "?"
	}
	f := strings.Fields(out)
	if len(f) >= 3 {
		return f[2]
	}
	return strings.TrimSpace(out)
}

// TestDaemonSet runs the image of `make image` as the shipped DaemonSet,
// from `kubectl apply -k` on deploy/, under containerd on every node: the
// pods run, /proc/sys is read-only in the daemon's container, its rules are
// in the node's namespace, and a pod reaches a Service through them.
func TestDaemonSet(t *testing.T) {
	b := bins(t)
	image, err := BuildImage(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Bins: b, Proxy: DaemonSet(), ExtraImages: []string{image}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			out, _ := c.Kubectl(context.Background(), "-n", "kube-system", "logs", "daemonset/nftproxy", "--all-containers", "--prefix", "--tail=40")
			t.Logf("nftproxy pods' logs:\n%s", out)
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	out, err := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=nftproxy",
		"-o", `jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "Running" {
			running[f[0]] = true
		}
	}
	for _, n := range c.Topo.Nodes {
		if !running[n.Name] {
			t.Fatalf("no Running nftproxy pod on %s:\n%s", n.Name, out)
		}
		pid, err := ContainerProcess(n, "/nftproxy", "run", "--config=/etc/nftproxy/config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		opts, err := MountOptions(pid, "/proc/sys")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Split(opts, ","), "ro") {
			t.Errorf("%s: the daemon's /proc/sys is mounted %s, want read-only (the runtime's default)", n.Name, opts)
		}
		tables, err := n.NS.Exec("nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(tables, "table ip nftproxy") {
			t.Errorf("%s: no nftproxy table in the node's namespace:\n%s", n.Name, tables)
		}
		t.Logf("%s: nftproxy pid %d, /proc/sys %s", n.Name, pid, opts)
	}
	checkEchoService(ctx, t, c)
}
