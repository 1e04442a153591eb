package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/proxier/kubeproxy"
)

// stopKubeProxy ends kube-proxy as a DaemonSet rollout would: SIGTERM,
// which leaves its rules in place.
func stopKubeProxy(k *Daemon) { k.Terminate(10 * time.Second) }

// kubeProxyConfig runs kube-proxy in mode against the relay, touching no
// global sysctl (conntrack limits and timeouts stay as they are).
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
clusterCIDR: 10.244.0.0/16
healthzBindAddress: 127.0.0.1:10266
metricsBindAddress: 127.0.0.1:10269
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
iptables:
  localhostNodePorts: false
  minSyncPeriod: 100ms
  syncPeriod: 30s
nftables:
  minSyncPeriod: 100ms
  syncPeriod: 30s
`

// startKubeProxy runs kube-proxy in ns in mode ("nftables", "iptables-nft"
// or "iptables-legacy": iptables mode on that backend, chosen as kube-proxy
// chooses it, by the iptables first on its PATH).
func startKubeProxy(t *testing.T, ns *netns.NS, bin, mode, kubeconfig string) *Daemon {
	t.Helper()
	dir := t.TempDir()
	kpMode := "nftables"
	env := os.Environ()
	if backend, ok := strings.CutPrefix(mode, "iptables-"); ok {
		kpMode = "iptables"
		env = append(env, "PATH="+iptablesTools(t, backend)+":"+os.Getenv("PATH"))
	}
	cfg := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, kubeProxyConfig, kpMode, kubeconfig, clusterNode), 0o644); err != nil {
		t.Fatal(err)
	}
	k, err := StartCommandWithEnv(ns, env, bin, "--config", cfg, "--v", "2")
	if err != nil {
		t.Fatalf("start kube-proxy: %v", err)
	}
	t.Cleanup(func() {
		stopKubeProxy(k)
		if t.Failed() {
			t.Logf("kube-proxy (%s) log:\n%s", mode, k.Log())
		}
	})
	return k
}

// iptablesTools returns a directory in which iptables, iptables-save,
// iptables-restore and the ip6tables ones are backend's ("nft" or
// "legacy"), and nft is nft.
func iptablesTools(t *testing.T, backend string) string {
	t.Helper()
	links := t.TempDir()
	if err := IptablesTools(links, backend); errors.Is(err, exec.ErrNotFound) {
		t.Skipf("skipping: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return links
}

// adminKubeconfig writes a copy of the admin kubeconfig that goes through
// the relay: kube-proxy, unlike nftproxy, writes events.
func adminKubeconfig(t *testing.T, admin, relay string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig-admin")
	if err := apiserver.RelayedKubeconfig(admin, relay, "", path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeProxyRules returns kube-proxy's rules left in ns: its nftables
// tables and its iptables chains in either backend. Kubelet's three chains
// don't count: kube-proxy's iptables mode writes KUBE-FIREWALL too, a copy
// of kubelet's, which the cleanup leaves to kubelet.
func kubeProxyRules(t *testing.T, ns *netns.NS) string {
	t.Helper()
	var b strings.Builder
	tables, err := ns.Exec("nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(tables, "\n") {
		if strings.Contains(l, "kube-proxy") {
			fmt.Fprintln(&b, l)
		}
	}
	tools := []string{"iptables-nft-save", "ip6tables-nft-save"}
	if names, _ := ns.Exec("cat", "/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"); strings.TrimSpace(names) != "" {
		tools = append(tools, "iptables-legacy-save", "ip6tables-legacy-save")
	}
	for _, tool := range tools {
		out, err := ns.Exec(tool)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, ":KUBE-") && !strings.HasPrefix(l, ":KUBE-FIREWALL ") &&
				!strings.HasPrefix(l, ":KUBE-KUBELET-CANARY ") && !strings.HasPrefix(l, ":KUBE-IPTABLES-HINT ") {
				fmt.Fprintf(&b, "%s %s\n", tool, l)
			}
		}
	}
	return b.String()
}

// savedWithoutKubeProxy returns tool's iptables-save output in ns without
// comment lines, counters, kube-proxy's chains, their rules and the rules
// jumping or going to them: what removing kube-proxy's chains must leave
// as it was.
func savedWithoutKubeProxy(t *testing.T, ns *netns.NS, tool string) string {
	t.Helper()
	out, err := ns.Exec(tool)
	if err != nil {
		t.Fatal(err)
	}
	counters := regexp.MustCompile(` \[\d+:\d+\]$`)
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0 || strings.HasPrefix(l, "#"):
			continue
		case strings.HasPrefix(l, ":") && kubeproxy.IsChain(f[0][1:]):
			continue
		case f[0] == "-A" && len(f) > 1:
			if kubeproxy.IsChain(f[1]) {
				continue
			}
			if i := max(slices.Index(f, "-j"), slices.Index(f, "-g")); i > 0 && i+1 < len(f) && kubeproxy.IsChain(f[i+1]) {
				continue
			}
		}
		fmt.Fprintln(&b, counters.ReplaceAllString(l, ""))
	}
	return b.String()
}

// prober opens a new connection to addr every 20 ms and records the
// failures.
type prober struct {
	mu       sync.Mutex
	ok, fail int
	failures []time.Time
	stop     func()
	done     chan struct{}
}

func startProber(ctx context.Context, client *netns.NS, addr netip.AddrPort) *prober {
	ctx, cancel := context.WithCancel(ctx)
	p := &prober{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for ctx.Err() == nil {
			c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := client.AskTCP(c, addr)
			cancel()
			p.mu.Lock()
			if err == nil {
				p.ok++
			} else if ctx.Err() == nil {
				p.fail++
				p.failures = append(p.failures, time.Now())
			}
			p.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return p
}

// finish stops the prober and returns the counts and the longest time
// between the first and last of consecutive failures (one failure counts
// as its timeout).
func (p *prober) finish() (ok, fail int, gap time.Duration) {
	p.stop()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.failures); {
		j := i
		// Failures less than 400 ms apart (the probe period plus its
		// timeout) are one outage.
		for j+1 < len(p.failures) && p.failures[j+1].Sub(p.failures[j]) < 400*time.Millisecond {
			j++
		}
		gap = max(gap, p.failures[j].Sub(p.failures[i])+300*time.Millisecond)
		i = j + 1
	}
	return p.ok, p.fail, gap
}

// TestMigrateFromKubeProxy runs the real kube-proxy (same version as the
// API server) in a node namespace in nftables mode and in iptables mode on
// both backends until a ClusterIP and a NodePort answer, opens a long-lived
// connection through the NodePort, stops kube-proxy and starts nftproxy
// with --cleanup-kube-proxy (with no iptables tool on its PATH, as in its
// image, for all three modes): kube-proxy's rules are gone,
// nftproxy's serve the same Services, the connection still carries data,
// and new connections (probed every 20 ms) never fail for more than one
// sync. Then the way back: kube-proxy started again, `nftproxy cleanup`,
// traffic flows.
func TestMigrateFromKubeProxy(t *testing.T) {
	if binary == "" {
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	kp := filepath.Join(apiserver.DefaultBinDir(), "kube-proxy")
	if _, err := os.Stat(kp); err != nil {
		t.Skipf("skipping: kube-proxy not built (%v); build it with e2e/apiserver/build.sh or `make k8s-bins`", err)
	}
	env := newClusterEnv(t)
	for i, mode := range []string{"nftables", "iptables-nft", "iptables-legacy"} {
		t.Run(mode, func(t *testing.T) { testMigrate(t, env, kp, mode, i) })
	}
}

// testMigrate runs one migration; mode is kube-proxy's (see startKubeProxy).
func testMigrate(t *testing.T, env *clusterEnv, kpBinary, mode string, i int) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := &clusterScenario{t: t, env: env, ns: "migrate-" + strings.ReplaceAll(mode, "-", ""), ctx: ctx}
	s.setUp("e2m", 2)

	clusterIP := netip.AddrFrom4([4]byte{10, 96, 50, byte(10 + i)})
	nodePort := int32(30500 + i)
	s.service("web", clusterIP.String(), nodePort)
	addrs, names := s.pods(0, 1)
	s.slice("web", "web-1", addrs...)
	vip := netip.AddrPortFrom(clusterIP, 80)
	np := netip.AddrPortFrom(s.topo.NodeAddr, uint16(nodePort))

	// kube-proxy serves the service.
	k := startKubeProxy(t, s.topo.Node, kpBinary, mode, adminKubeconfig(t, env.srv.Kubeconfig, s.relay.Addr()))
	took := s.eventually("kube-proxy serving the ClusterIP and NodePort", func() error {
		if k.Exited() {
			return errors.New("kube-proxy exited")
		}
		if err := s.answeredBy(vip, names); err != nil {
			return err
		}
		return s.answeredBy(np, names)
	})
	t.Logf("kube-proxy (%s) serving after %s", mode, took.Round(time.Millisecond))
	if kubeProxyRules(t, s.topo.Node) == "" {
		t.Fatalf("kube-proxy serves, but no rules of its own found:\n%s", s.ruleset())
	}

	session, err := s.topo.Client.ConnectTCP(ctx, netip.AddrPort{}, np)
	if err != nil {
		t.Fatalf("long-lived connection through the NodePort: %v", err)
	}
	defer session.Close()
	if _, err := session.Echo(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	probe := startProber(ctx, s.topo.Client, vip)

	// The switch.
	stopKubeProxy(k)
	saves := []string{"iptables-nft-save", "ip6tables-nft-save"}
	if mode == "iptables-legacy" {
		saves = append(saves, "iptables-legacy-save", "ip6tables-legacy-save")
	}
	others := map[string]string{}
	for _, tool := range saves {
		others[tool] = savedWithoutKubeProxy(t, s.topo.Node, tool)
	}
	start := time.Now()
	s.args = []string{"--kubeconfig", s.kubeconfig, "--hostname-override", clusterNode, "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
		"--min-sync-period", "100ms", "--cleanup-kube-proxy", "-v", "2"}
	// As in nftproxy's image: no iptables tools. The nft backend's chains
	// go over netlink, the legacy backend's over a raw socket.
	s.daemonEnv = []string{"PATH=" + t.TempDir()}
	s.startDaemon()
	t.Logf("nftproxy's first sync %s after kube-proxy stopped", time.Since(start).Round(time.Millisecond))
	if left := kubeProxyRules(t, s.topo.Node); left != "" {
		t.Errorf("kube-proxy's rules left after nftproxy's first sync:\n%s", left)
	}
	for _, tool := range saves {
		if diff := cmp.Diff(others[tool], savedWithoutKubeProxy(t, s.topo.Node, tool)); diff != "" {
			t.Errorf("%s: the cleanup changed more than kube-proxy's chains and the jumps to them (-before +after):\n%s", tool, diff)
		}
	}
	if err := s.answeredBy(vip, names); err != nil {
		t.Error(err)
	}
	if err := s.answeredBy(np, names); err != nil {
		t.Error(err)
	}
	if got, err := session.Echo(ctx, "after"); err != nil || got != "after" {
		t.Errorf("the connection opened under kube-proxy, after the switch: %q, %v", got, err)
	}
	time.Sleep(200 * time.Millisecond) // probes after the switch too
	ok, fail, gap := probe.finish()
	t.Logf("new connections during the switch: %d answered, %d failed, longest outage %s", ok, fail, gap)
	// One sync at most: the first, which replaced kube-proxy's rules.
	if gap > time.Second {
		t.Errorf("new connections failed for %s during the switch", gap)
	}
	for _, l := range strings.Split(s.d.Log(), "\n") {
		if strings.Contains(l, "kube-proxy's") || strings.Contains(l, "Kube-proxy's") {
			t.Logf("nftproxy: %s", l)
		}
	}
	if strings.Contains(s.d.Log(), "Removing kube-proxy's iptables chains failed") {
		t.Errorf("iptables cleanup failed:\n%s", s.d.Log())
	}
	if backend, ok := strings.CutPrefix(mode, "iptables-"); ok &&
		!strings.Contains(s.d.Log(), `"msg":"Removed kube-proxy's iptables chains","backend":"iptables-`+backend+`"`) {
		t.Errorf("no log of kube-proxy's %s chains removed:\n%s", mode, s.d.Log())
	}

	// The way back: kube-proxy again beside nftproxy's rules, then nftproxy's go.
	if err := s.d.Stop(); err != nil {
		t.Fatal(err)
	}
	k2 := startKubeProxy(t, s.topo.Node, kpBinary, mode, adminKubeconfig(t, env.srv.Kubeconfig, s.relay.Addr()))
	s.eventually("kube-proxy's first sync", func() error {
		if k2.Exited() {
			return errors.New("kube-proxy exited")
		}
		synced := false
		for _, l := range strings.Split(k2.Log(), "\n") {
			synced = synced || strings.Contains(l, "SyncProxyRules complete") && strings.Contains(l, `"IPv4"`)
		}
		if !synced || !strings.Contains(kubeProxyRuleset(t, s.topo.Node), clusterIP.String()) {
			return errors.New("no rule for the ClusterIP yet")
		}
		return nil
	})
	if out, err := s.topo.Node.Exec(binary, "cleanup"); err != nil {
		t.Fatalf("nftproxy cleanup: %v: %s", err, out)
	}
	if rs := s.ruleset(); strings.Contains(rs, "nftproxy") {
		t.Errorf("nftproxy's tables left after cleanup:\n%s", rs)
	}
	if err := s.answeredBy(vip, names); err != nil {
		t.Errorf("back on kube-proxy: %v", err)
	}
	if err := s.answeredBy(np, names); err != nil {
		t.Errorf("back on kube-proxy: %v", err)
	}
	if got, err := session.Echo(ctx, "back"); err != nil || got != "back" {
		t.Errorf("the connection, back on kube-proxy: %q, %v", got, err)
	}
}

// kubeProxyRuleset is kube-proxy's nftables tables and iptables rules, as text.
func kubeProxyRuleset(t *testing.T, ns *netns.NS) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range [][]string{{"nft", "list", "ruleset"}, {"iptables-nft-save"}, {"iptables-legacy-save"}} {
		out, _ := ns.Exec(cmd...)
		b.WriteString(out)
	}
	return b.String()
}
