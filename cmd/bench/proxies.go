package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Where each proxy serves /metrics inside its namespace.
const (
	peerMetricsAddr = "127.0.0.1:10249"
	peerHealthzAddr = "127.0.0.1:10256"
)

// peerSyncPeriod keeps periodic resyncs out of the measured window: every
// proxy gets it.
const peerSyncPeriod = "1h"

// proxyProcess is one proxy running in its namespace.
type proxyProcess struct {
	name string
	ns   *netns.NS
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	http *http.Client
	// page is the /metrics page scrape read last.
	page string
}

// peerBinaries are the programs the peers phase runs.
type peerBinaries struct {
	kubeProxy string
	nftproxy  string
	nftMulti  string // xtables-nft-multi
	legacy    string // xtables-legacy-multi
}

// iptablesLinks makes a directory whose iptables, iptables-save,
// iptables-restore (and ip6tables…) are multi, so that putting it first on
// kube-proxy's PATH picks that backend: kube-proxy runs whatever `iptables`
// its PATH finds, and the xtables multi-binaries act by the name they are
// called by.
func iptablesLinks(dir, multi string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make iptables link directory: %w", err)
	}
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		if err := os.Symlink(multi, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
	}
	return nil
}

// proxyCommand returns the command line and PATH prefix of a proxy;
// kubeconfig reaches the API server through the namespace's relay.
func proxyCommand(proxy string, bin peerBinaries, kubeconfig, linkDir string) (args []string, pathDir string) {
	kube := func(mode string) []string {
		return []string{bin.kubeProxy, "--kubeconfig=" + kubeconfig, "--hostname-override=" + benchNode,
			"--proxy-mode=" + mode, "--cluster-cidr=" + peersClusterCIDR.String(),
			"--metrics-bind-address=" + peerMetricsAddr, "--healthz-bind-address=" + peerHealthzAddr,
			"--iptables-sync-period=" + peerSyncPeriod,
			// Conntrack sysctls are global or absent in a namespace: leave them.
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--oom-score-adj=0", "--v=2"}
	}
	switch proxy {
	case proxyKubeNft:
		return kube("nftables"), ""
	case proxyKubeIptNft:
		return kube("iptables"), filepath.Join(linkDir, "nft")
	case proxyKubeLegacy:
		return kube("iptables"), filepath.Join(linkDir, "legacy")
	default:
		return append(nftproxyCommand(bin.nftproxy, "--kubeconfig", kubeconfig), "--sync-period", peerSyncPeriod), ""
	}
}

// nftproxyCommand is nftproxy's command line in a bench namespace, reading
// its objects from source (--kubeconfig FILE or --manifests DIR).
func nftproxyCommand(binary string, source ...string) []string {
	return append(append([]string{binary, "run"}, source...), "--hostname-override", benchNode,
		"--cluster-cidr", peersClusterCIDR.String(),
		"--metrics-bind-address", peerMetricsAddr, "--healthz-bind-address", peerHealthzAddr)
}

// startProxy runs args in ns through `ip netns exec`, which execs the
// proxy in place, so the pid is the proxy's. Its log goes to logPath.
func startProxy(name string, ns *netns.NS, args []string, pathDir, logPath string) (*proxyProcess, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name()}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if pathDir != "" {
		cmd.Env = append(os.Environ(), "PATH="+pathDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proxyProcess{name: name, ns: ns, cmd: cmd, log: log, done: make(chan struct{})}
	p.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return ns.Dial(ctx, network, addr) },
	}}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports whether the proxy has ended.
func (p *proxyProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and kills the proxy if it is still there after five
// seconds (or at once when kill is set: a proxy stopped at the time limit
// may be in a long sync).
func (p *proxyProcess) stop(kill bool) {
	defer p.log.Close()
	if p.exited() {
		return
	}
	if kill {
		_ = p.cmd.Process.Kill()
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// scrape reads the proxy's sync histogram.
func (p *proxyProcess) scrape(ctx context.Context) (histogram, error) {
	page, err := p.metrics(ctx)
	if err != nil {
		return histogram{}, err
	}
	p.page = page
	return parseHistogram(page, syncMetric)
}

// metrics reads the proxy's /metrics page.
func (p *proxyProcess) metrics(ctx context.Context) (string, error) { return p.get(ctx, "/metrics") }

// get reads a page of the proxy's metrics server.
func (p *proxyProcess) get(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+peerMetricsAddr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("read %s %s: %w", p.name, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("read %s %s: %s", p.name, path, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read %s %s: %w", p.name, path, err)
	}
	return string(body), nil
}

// memory returns the proxy's VmRSS and VmHWM in MiB.
func (p *proxyProcess) memory() (rss, peak float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read %s status: %w", p.name, err)
	}
	st := parseProcStatus(string(data))
	return float64(st["VmRSS"]) / 1024, float64(st["VmHWM"]) / 1024, nil
}

// logTail returns the last lines of the proxy's log, for errors.
func (p *proxyProcess) logTail(n int) string {
	f, err := os.Open(p.log.Name())
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
