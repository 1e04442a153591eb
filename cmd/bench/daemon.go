package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
)

// daemonSyncTimeout bounds the wait for the daemon's syncs.
const daemonSyncTimeout = 3 * time.Minute

// Steady state is the daemon after this many periodic resyncs, due every
// daemonSyncPeriod (its --sync-period) after the first sync.
const (
	daemonResyncs    = 2
	daemonSyncPeriod = 5 * time.Second
)

// daemonFigures is what one daemon run measured.
type daemonFigures struct {
	startMS            float64 // exec to the first sync logged
	firstRSS, steadyRS float64 // MiB after the first sync, after the resyncs
	loadPeak           float64 // MiB, VmHWM when the manifests were loaded, before the first sync
	peak               float64 // MiB, the highest VmHWM read
	heapAlloc          float64 // MiB, go_memstats_heap_alloc_bytes at the end
	releaseMS          float64 // giving the first sync's garbage back, as logged
	fullSyncMS         float64 // the first sync, as logged
	endpointMS         float64 // median sync of one endpoint replaced in a manifest file, as logged
}

// daemonEndpointSteps is how many times the daemon phase replaces one
// endpoint (back and forth) after steady state; the median counts.
const daemonEndpointSteps = 7

// daemonPhase runs the real daemon, `nftproxy run --manifests DIR`, on
// generated manifests in a fresh namespace at each size and records how long
// its first sync took from exec (reading and decoding the manifests
// included) and its resident memory after it and at steady state.
func daemonPhase(res *Results, o *options) error {
	if _, err := os.Stat(o.nftproxy); err != nil {
		for _, n := range o.sizes {
			res.skip(n, metricDaemonRSS, methodDaemon, "no nftproxy binary (make build)")
		}
		return nil
	}
	type shape struct{ n, eps int }
	var shapes []shape
	for _, n := range o.sizes {
		if n > o.daemonMax {
			res.skip(n, metricDaemonRSS, methodDaemon, fmt.Sprintf("not run above %d services (--daemon-max)", o.daemonMax))
			continue
		}
		shapes = append(shapes, shape{n, endpointsPerService})
	}
	for _, n := range o.daemonOne {
		shapes = append(shapes, shape{n, 1})
	}
	for _, s := range shapes {
		n, method := s.n, func(m string) string { return daemonMethod(m, s.eps) }
		logf("daemon, %d services x %d endpoints", n, s.eps)
		f, err := runDaemon(o.nftproxy, n, s.eps, o.daemonProfiles)
		if err != nil {
			return fmt.Errorf("%d services: %w", n, err)
		}
		res.add(n, metricDaemonStart, method(methodDaemon), f.startMS)
		res.add(n, metricDaemonRSS, method(methodDaemonFirst), f.firstRSS)
		res.add(n, metricDaemonRSS, method(methodDaemon), f.steadyRS)
		res.add(n, metricDaemonPeak, method(methodDaemon), f.peak)
		if f.loadPeak > 0 {
			res.add(n, metricDaemonPeak, method(methodDaemonLoaded), f.loadPeak)
		}
		res.add(n, metricDaemonHeap, method(methodDaemon), f.heapAlloc)
		if f.releaseMS > 0 {
			res.add(n, metricDaemonRelease, method(methodDaemon), f.releaseMS)
		}
		res.add(n, metricDaemonFullSync, method(methodDaemon), f.fullSyncMS)
		res.add(n, metricDaemonEndpoint, method(methodDaemon), f.endpointMS)
	}
	return nil
}

// daemonMethod names a daemon figure's method for services of eps
// endpoints: the bench's usual three keep the plain name.
func daemonMethod(method string, eps int) string {
	if eps == endpointsPerService {
		return method
	}
	return fmt.Sprintf("%s, %d endpoint(s) per service", method, eps)
}

// With profiles set it also saves the daemon's heap profile at steady state
// there, as daemon-heap-N.pb.gz (`go tool pprof` reads it).
func runDaemon(binary string, n, eps int, profiles string) (f daemonFigures, err error) {
	dir, err := os.MkdirTemp("", "nftproxy-bench-manifests-")
	if err != nil {
		return f, fmt.Errorf("make manifest directory: %w", err)
	}
	defer os.RemoveAll(dir)
	// The service whose endpoint the steps replace has a file of its own,
	// so that a step rewrites (and the daemon reads again) one service.
	all := snapshot(n, nil)
	for i := range all.Services {
		all.Services[i].Endpoints = all.Services[i].Endpoints[:eps]
	}
	step := n / 2
	rest := &k8s.Snapshot{Services: append(slices.Clone(all.Services[:step]), all.Services[step+1:]...)}
	stepFile := filepath.Join(dir, "step.yaml")
	stepVersions := [2]*k8s.Snapshot{{Services: all.Services[step : step+1]},
		withEndpointChanged(&k8s.Snapshot{Services: all.Services[step : step+1]}, 0, replacementEndpoint(0))}
	if err := writeManifests(filepath.Join(dir, "services.yaml"), rest); err != nil {
		return f, err
	}
	if err := writeManifests(stepFile, stepVersions[0]); err != nil {
		return f, err
	}
	err = freshNS(func(ns *netns.NS) error {
		var log lockedBuffer
		cmd := exec.Command("ip", "netns", "exec", ns.Name(), binary, "run", "--manifests", dir,
			"--hostname-override", "node-1", "--node-ip", netns.NodeAddr.String(), "--cluster-cidr", clusterCIDR.String(),
			"--sync-period", daemonSyncPeriod.String(), "--metrics-bind-address", daemonMetrics, "-v", "2", "--profiling="+strconv.FormatBool(profiles != ""))
		cmd.Stdout, cmd.Stderr = &log, &log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start nftproxy: %w", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), daemonSyncTimeout)
		defer cancel()
		// VmHWM is read at every poll and the highest kept: a later
		// reading was seen lower than an earlier one (41 MiB after 42 at
		// 1,000 services; the kernel's RSS counters are per CPU and read
		// approximately), and a reading is at least the RSS of its moment.
		peak := func() float64 {
			if st, err := procStatus(cmd.Process.Pid); err == nil {
				f.peak = max(f.peak, float64(st["VmHWM"])/1024)
			}
			return f.peak
		}
		// The daemon logs one JSON line per sync, and with -v 2 one per
		// periodic resync it skipped, and one when it loaded the
		// manifests: the peak then is decoding's, before the first sync
		// (which starts at once, so up to one poll of it may count).
		waitLines := func(want int, patterns ...string) error {
			count := func() int {
				n := 0
				for _, p := range patterns {
					n += strings.Count(log.String(), p)
				}
				return n
			}
			for count() < want {
				if p := peak(); f.loadPeak == 0 && strings.Contains(log.String(), `"msg":"Loaded manifests"`) {
					f.loadPeak = p
				}
				select {
				case <-done:
					return fmt.Errorf("nftproxy exited: %s", firstLines(log.String(), 5))
				case <-ctx.Done():
					return fmt.Errorf("wait for nftproxy's sync %d: %w; its log ends: %s", want, ctx.Err(), lastLines(log.String(), 3))
				case <-time.After(20 * time.Millisecond):
				}
			}
			return nil
		}
		waitSyncs := func(want int) error { return waitLines(want, syncedLine, resyncSkippedLine) }
		if err := waitSyncs(1); err != nil {
			return err
		}
		f.startMS = ms(time.Since(start))
		// `ip netns exec` execs the daemon, so the pid is the daemon's.
		time.Sleep(time.Second)
		st, err := procStatus(cmd.Process.Pid)
		if err != nil {
			return err
		}
		f.firstRSS = float64(st["VmRSS"]) / 1024
		f.releaseMS = releaseTook(log.String())
		if err := waitSyncs(1 + daemonResyncs); err != nil {
			return err
		}
		time.Sleep(time.Second)
		if st, err = procStatus(cmd.Process.Pid); err != nil {
			return err
		}
		f.steadyRS, f.peak = float64(st["VmRSS"])/1024, max(f.peak, float64(st["VmHWM"])/1024)
		f.fullSyncMS = syncTook(log.String(), 0)
		// One endpoint replaced, back and forth: each rewrite is one delta
		// sync, logged with what it took, counted from the syncs so far (a
		// sync of nothing may follow the first one: a late signal of the
		// source).
		synced := strings.Count(log.String(), syncedLine)
		var took []float64
		for i := range daemonEndpointSteps {
			// Written aside and renamed into place, as kubelet updates a
			// mounted ConfigMap: the daemon never reads half a file.
			if err := writeManifests(stepFile+".new", stepVersions[(i+1)%2]); err != nil {
				return err
			}
			if err := os.Rename(stepFile+".new", stepFile); err != nil {
				return fmt.Errorf("replace %s: %w", stepFile, err)
			}
			if err := waitLines(synced+i+1, syncedLine); err != nil {
				return err
			}
			took = append(took, syncTook(log.String(), synced+i))
		}
		slices.Sort(took)
		f.endpointMS = took[len(took)/2]
		heap, err := daemonGauge(ctx, ns, "go_memstats_heap_alloc_bytes")
		f.heapAlloc = heap / (1 << 20)
		if err != nil || profiles == "" {
			return err
		}
		return saveHeapProfile(ctx, ns, filepath.Join(profiles, fmt.Sprintf("daemon-heap-%d.pb.gz", n)))
	})
	return f, err
}

// The daemon's log lines for a sync and for a periodic resync it skipped.
const (
	syncedLine        = `"msg":"Synced"`
	resyncSkippedLine = `"msg":"Resync skipped`
)

// syncTook returns the took of the daemon's k-th "Synced" log line (from 0),
// in milliseconds; 0 when there is none.
func syncTook(log string, k int) float64 {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, syncedLine) {
			continue
		}
		if k > 0 {
			k--
			continue
		}
		var l struct{ Took float64 }
		if json.Unmarshal([]byte(line), &l) == nil {
			return l.Took * 1000
		}
		return 0
	}
	return 0
}

// releaseTook finds the first "Released memory" line of the daemon's log
// (-v 2) and returns its took, in milliseconds; 0 when there is none.
func releaseTook(log string) float64 {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `"msg":"Released memory`) {
			continue
		}
		var l struct {
			Took float64 `json:"took"`
		}
		if json.Unmarshal([]byte(line), &l) == nil {
			return l.Took * 1000 // zap logs durations in seconds
		}
	}
	return 0
}

// daemonMetrics is where the daemon serves /metrics, inside its namespace.
const daemonMetrics = "127.0.0.1:10249"

// daemonGet fetches a path of the daemon's metrics server.
func daemonGet(ctx context.Context, ns *netns.NS, path string) (*http.Response, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return ns.Dial(ctx, network, addr) },
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+daemonMetrics+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return resp, nil
}

// saveHeapProfile writes the daemon's heap profile to file, after a
// collection so that it shows what is live.
func saveHeapProfile(ctx context.Context, ns *netns.NS, file string) error {
	resp, err := daemonGet(ctx, ns, "/debug/pprof/heap?gc=1")
	if err != nil {
		return fmt.Errorf("read heap profile: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read heap profile: %w", err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return fmt.Errorf("write heap profile: %w", err)
	}
	return nil
}

// daemonGauge reads one unlabelled gauge from the daemon's /metrics.
func daemonGauge(ctx context.Context, ns *netns.NS, name string) (float64, error) {
	resp, err := daemonGet(ctx, ns, "/metrics")
	if err != nil {
		return 0, fmt.Errorf("read metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("read metrics: no %s", name)
}

func abs(x int) int { return max(x, -x) }

// procStatus reads the kB fields of a process's /proc status (VmRSS, VmHWM).
func procStatus(pid int) (map[string]int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("read process status: %w", err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if v, unit := strings.CutSuffix(strings.TrimSpace(v), " kB"); ok && unit {
			if n, err := strconv.Atoi(v); err == nil {
				out[k] = n
			}
		}
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, errors.New("read process status: no VmRSS")
	}
	return out, nil
}

// writeManifests writes the snapshot's services as Service and EndpointSlice
// manifests, in one file.
func writeManifests(path string, snap *k8s.Snapshot) error {
	var b bytes.Buffer
	for _, sp := range snap.Services {
		typ, nodePortLine := "ClusterIP", ""
		if sp.NodePort != 0 {
			typ, nodePortLine = "NodePort", fmt.Sprintf("\n    nodePort: %d", sp.NodePort)
		}
		fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  type: %[3]s
  clusterIP: %[4]s
  clusterIPs: [%[4]s]
  ports:
  - name: %[5]s
    protocol: TCP
    port: %[6]d
    targetPort: %[7]d%[8]s
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-bench
  namespace: %[2]s
  labels:
    kubernetes.io/service-name: %[1]s
    endpointslice.kubernetes.io/managed-by: nftproxy-bench
addressType: IPv4
ports:
- name: %[5]s
  protocol: TCP
  port: %[7]d
endpoints:
`, sp.Name.Name, sp.Name.Namespace, typ, sp.ClusterIPs[0], sp.Name.Port, sp.Port, endpointPort, nodePortLine)
		for _, e := range sp.Endpoints {
			fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: {ready: true, serving: true, terminating: false}\n", e.Addr)
		}
		b.WriteString("---\n")
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write manifests: %w", err)
	}
	return nil
}

// lockedBuffer collects a process's output while another goroutine reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
