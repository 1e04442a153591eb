package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// Where every proxy serves /metrics and /healthz inside its namespace.
const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// peerSyncPeriod keeps periodic resyncs out of the measured window: every
// proxy gets it.
const peerSyncPeriod = "1h"

// The histograms the phases read: each sync under kube-proxy's name (by
// ip_family), nftproxy's whole syncs (both families' tables: each family's
// syncMetric series counts its own table's share), and the time from a
// change seen to it being in the kernel.
const (
	syncMetric      = "kubeproxy_sync_proxy_rules_duration_seconds"
	wholeSyncMetric = "nftproxy_sync_duration_seconds"
	progMetric      = "kubeproxy_network_programming_duration_seconds"
)

// proxy is one proxy running in its namespace, as the daemon, peers and soak
// phases start it: its process and log (e2e.Daemon) and its metrics.
type proxy struct {
	*e2e.Daemon
	name    string
	metrics *prom.Client
	// fams is the page scrape read last.
	fams prom.Families
}

// startProxy runs args in ns with env (nil: the bench's own).
func startProxy(name string, ns *netns.NS, env []string, args ...string) (*proxy, error) {
	d, err := e2e.StartCommandWithEnv(ns, env, args[0], args[1:]...)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proxy{Daemon: d, name: name, metrics: prom.NewClient(ns, metricsAddr, 10*time.Second)}, nil
}

// scrape reads the proxy's /metrics and keeps it in fams.
func (p *proxy) scrape(ctx context.Context) (prom.Families, error) {
	fams, _, err := p.metrics.Scrape(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", p.name, err)
	}
	p.fams = fams
	return fams, nil
}

// gauge returns a gauge of the last scrape.
func (p *proxy) gauge(name string) (float64, error) {
	v, ok := p.fams.Gauge(name)
	if !ok {
		return 0, fmt.Errorf("read %s metrics: no %s", p.name, name)
	}
	return v, nil
}

// liveHeap asks the proxy for a collection and returns its heap right after,
// in MiB. The heap profile that comes with the collection is saved to
// profile unless that is empty (`go tool pprof -base START END` shows what
// grew).
func (p *proxy) liveHeap(ctx context.Context, profile string) (float64, error) {
	prof, err := p.metrics.Get(ctx, "/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, fmt.Errorf("read heap profile: %w", err)
	}
	if profile != "" {
		if err := os.WriteFile(profile, prof, 0o644); err != nil {
			return 0, fmt.Errorf("write heap profile: %w", err)
		}
	}
	return p.heapMiB(ctx)
}

// heapMiB scrapes the proxy's Go heap, in MiB.
func (p *proxy) heapMiB(ctx context.Context) (float64, error) {
	if _, err := p.scrape(ctx); err != nil {
		return 0, err
	}
	v, err := p.gauge("go_memstats_heap_alloc_bytes")
	return v / (1 << 20), err
}

// command returns the command line of a proxy of the peers phase;
// kubeconfig reaches the API server through the namespace's relay.
func (e *peerEnv) command(proxy, kubeconfig string) []string {
	if proxy == proxyNftproxy {
		return append(nftproxyCommand(e.o.nftproxy, "--kubeconfig", kubeconfig), "--sync-period", peerSyncPeriod)
	}
	mode := "iptables"
	if proxy == proxyKubeNft {
		mode = "nftables"
	}
	return []string{e.kubeProxy, "--kubeconfig=" + kubeconfig, "--hostname-override=" + benchNode,
		"--proxy-mode=" + mode, "--cluster-cidr=" + peersClusterCIDR.String(),
		"--metrics-bind-address=" + metricsAddr, "--healthz-bind-address=" + healthzAddr,
		"--iptables-sync-period=" + peerSyncPeriod,
		// Conntrack sysctls are global or absent in a namespace: leave them.
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--oom-score-adj=0", "--v=2"}
}

// nftproxyCommand is nftproxy's command line in a bench namespace, reading
// its objects from source (--kubeconfig FILE or --manifests DIR).
func nftproxyCommand(binary string, source ...string) []string {
	return append(append([]string{binary, "run"}, source...), "--hostname-override", benchNode,
		"--cluster-cidr", peersClusterCIDR.String(),
		"--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr)
}

// loggedLine is one line of nftproxy's JSON log: when, and the took it
// logged, in milliseconds (zap logs durations in seconds).
type loggedLine struct {
	at     time.Time
	tookMS float64
}

// zapISO8601 is the layout of the daemon's log timestamps
// (zapcore.ISO8601TimeEncoder).
const zapISO8601 = "2006-01-02T15:04:05.000Z0700"

// The daemon's log messages the phases count.
const (
	syncedLine        = e2e.SyncedLine
	resyncSkippedLine = e2e.ResyncSkippedLine
	releasedLine      = `"msg":"Released memory`
)

// logged returns the lines of nftproxy's log that hold msg (one of the
// lines above), in order.
func logged(log, msg string) ([]loggedLine, error) {
	var out []loggedLine
	for line := range strings.Lines(log) {
		if !strings.Contains(line, msg) {
			continue
		}
		var l struct {
			TS   string  `json:"ts"`
			Took float64 `json:"took"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			return nil, fmt.Errorf("parse nftproxy log: %w", err)
		}
		at, err := time.Parse(zapISO8601, l.TS)
		if err != nil {
			return nil, fmt.Errorf("parse nftproxy log: %w", err)
		}
		out = append(out, loggedLine{at: at, tookMS: l.Took * 1000})
	}
	return out, nil
}
