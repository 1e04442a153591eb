package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// The soak phase (`make soak`): nftproxy under endpoint churn for a while,
// with clients connecting throughout through ClusterIPs to real endpoints;
// see soakmodel.go for the churn and soakpods.go for the endpoints.

// Where nftproxy reads its objects from.
const (
	soakSourceAPI       = "kube-apiserver"
	soakSourceManifests = "manifest directory"
)

// soakOptions are the soak's flags.
type soakOptions struct {
	duration  time.Duration
	services  int
	rate      int // endpoint replacements a second
	connRate  int // client connections a second
	grace     time.Duration
	manifests bool // the manifest directory instead of the API server
	command   string
	profiles  string // directory for the daemon's heap profiles; none when empty
}

// profile returns where the heap profile of a point of the soak goes, ""
// for none.
func (so soakOptions) profile(point string) string {
	if so.profiles == "" {
		return ""
	}
	return filepath.Join(so.profiles, "soak-heap-"+point+".pb.gz")
}

// Fixed shape of the soak.
const (
	soakEndpoints     = 3
	soakWorkers       = 64
	soakInflight      = 64 // client connections open at once, at most
	soakConnTimeout   = 5 * time.Second
	soakSampleEvery   = 10 * time.Second
	soakReadyTimeout  = 5 * time.Minute
	soakSeed          = 15
	soakRecentChanges = 1000
)

func soakPhase(res *Results, o *options) error {
	so := o.soak
	run := &SoakRun{Started: time.Now().UTC(), Command: so.command, Services: so.services, Endpoints: soakEndpoints,
		TargetRate: so.rate, GraceS: so.grace.Seconds(), ConnRate: so.connRate, Load: []string{loadAverage()}}
	if _, err := os.Stat(o.nftproxy); err != nil {
		return fmt.Errorf("find nftproxy (make build): %w", err)
	}
	w := workloadSpec{name: "soak", services: so.services, width: uniform(soakEndpoints), unplaced: true}.generate()
	model := newSoakModel(w, soakPool, soakSeed)
	owners := newAddrOwners(soakPool)
	for i, s := range model.services {
		for _, e := range s.endpoints {
			owners.set(e.addr, i)
		}
	}

	topo, err := netns.BuildTopology(netns.TopologyOptions{Prefix: nsPrefix + "s", Pods: soakPods})
	if err != nil {
		return err
	}
	defer topo.Close()
	servers, err := startSoakPods(topo, owners)
	defer servers.close()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "nftproxy-soak-")
	if err != nil {
		return fmt.Errorf("make scratch directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	ctx := context.Background()
	var sink soakSink
	var args []string
	if so.manifests {
		run.Source = soakSourceManifests
		dir := filepath.Join(tmp, "manifests")
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("make manifest directory: %w", err)
		}
		ms := manifestSink{dir: dir}
		logf("soak: writing %d manifest files", len(model.services))
		for i := range model.services {
			if err := ms.write(ctx, &model.services[i], model.endpoints(i)); err != nil {
				return err
			}
		}
		sink, args = ms, append(nftproxyCommand(o.nftproxy, "--manifests", dir), "--profiling")
	} else {
		run.Source = soakSourceAPI
		c, err := startCluster(ctx)
		if err != nil {
			return err
		}
		defer c.stop()
		services, slices := w.objects()
		logf("soak: writing %d services and %d endpoint slices to the API server", services, slices)
		began := time.Now()
		if err := c.load(ctx, w); err != nil {
			return err
		}
		run.CreateRate = float64(services+slices) / time.Since(began).Seconds()
		logf("soak: written in %s (%.0f objects/s)", time.Since(began).Round(time.Second), run.CreateRate)
		u, err := url.Parse(c.srv.URL)
		if err != nil {
			return fmt.Errorf("parse API server address: %w", err)
		}
		relay, err := netns.StartRelay(topo.Node, "127.0.0.1:0", u.Host)
		if err != nil {
			return err
		}
		defer relay.Close()
		kubeconfig := filepath.Join(tmp, "kubeconfig")
		if err := apiserver.RelayedKubeconfig(c.srv.Kubeconfig, relay.Addr(), "", kubeconfig); err != nil {
			return err
		}
		sink, args = apiSink{client: c.client}, append(nftproxyCommand(o.nftproxy, "--kubeconfig", kubeconfig), "--profiling")
	}

	logPath := filepath.Join(tmp, "nftproxy.log")
	p, err := startProxy("nftproxy", topo.Node, args, "", logPath)
	if err != nil {
		return err
	}
	defer p.stop(false)
	clients := &soakClients{ns: topo.Client, model: model.services, recent: newRecentRing(soakRecentChanges),
		rate: so.connRate, timeout: soakConnTimeout, failed: map[string]int{}}
	if err := soakWaitReady(ctx, p, clients); err != nil {
		return err
	}
	page, err := p.metrics(ctx)
	if err != nil {
		return err
	}
	syncBefore, err := parseBuckets(page, syncMetric)
	if err != nil {
		return err
	}
	progBefore, err := parseBuckets(page, progMetric)
	if err != nil {
		return err
	}
	if run.Idle, err = soakSample(ctx, p, time.Now(), clients, 0); err != nil {
		return err
	}
	if run.Idle.LiveHeapMiB, err = liveHeap(ctx, p, so.profile("idle")); err != nil {
		return err
	}
	logf("soak: nftproxy synced %d services; idle: %s", so.services, run.Idle)

	// The churn, the clients and the samples, for the duration.
	cctx, cancel := context.WithTimeout(ctx, so.duration)
	defer cancel()
	history := newAddrHistory()
	writers := startSoakWriters(ctx, sink, model.services, soakWorkers, history)
	clientsDone := make(chan struct{})
	go func() { clients.run(cctx, soakInflight, soakSeed); close(clientsDone) }()
	began := time.Now()
	var changes, terminating atomic.Int64
	churnDone := make(chan error, 1)
	go func() {
		churnDone <- soakChurn(cctx, model, owners, writers, history, clients.recent, so, &changes, &terminating)
	}()
	warmup := min(so.duration/10, time.Minute)
	sampleTick := time.NewTicker(soakSampleEvery)
	defer sampleTick.Stop()
	warm := time.After(warmup)
	lagFrom := 0
	sample := func() (SoakPoint, error) {
		pt, err := soakSample(ctx, p, began, clients, int(changes.Load()))
		pt.Terminating = int(terminating.Load())
		pt.WriteLagMS, lagFrom = writers.lagSince(lagFrom)
		return pt, err
	}
	for done := false; !done; {
		select {
		case <-cctx.Done():
			done = true
		case <-warm:
			if run.Start, err = sample(); err != nil {
				return err
			}
			if run.Start.LiveHeapMiB, err = liveHeap(ctx, p, so.profile("start")); err != nil {
				return err
			}
			logf("soak: start (after %s of churn): %s", warmup, run.Start)
		case <-sampleTick.C:
			pt, err := sample()
			if err != nil {
				return err
			}
			run.Samples = append(run.Samples, pt)
			logf("soak: %s", pt)
		}
	}
	run.End, err = sample()
	churnEnd := time.Now()
	if err != nil {
		return err
	}
	if run.End.LiveHeapMiB, err = liveHeap(ctx, p, so.profile("end")); err != nil {
		return err
	}
	run.Samples = append(run.Samples, run.End)
	if err := <-churnDone; err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	<-clientsDone
	writers.close()
	run.DurationS = churnEnd.Sub(began).Seconds()
	run.Changes, run.Writes, run.WriteErrors = int(changes.Load()), int(writers.done.Load()), int(writers.failed.Load())
	run.WriteP99MS = quantile(writers.latency, 0.99)
	if writers.firstErr != nil {
		run.FirstError = writers.firstErr.Error()
	}
	run.FailedBy, run.Failed = clients.failures()
	run.Connections, run.Examples, run.DeadHits = int(clients.attempts.Load()), clients.examples, int(servers.dead.Load())
	servers.mu.Lock()
	dead := slices.Clone(servers.deadAddrs)
	servers.mu.Unlock()
	for _, d := range dead {
		run.Examples = append(run.Examples, fmt.Sprintf("%s a connection reached %s, where no pod runs; its history:", d.at.UTC().Format("15:04:05.000"), d.addr))
		run.Examples = append(run.Examples, history.describe(d.addr)...)
	}
	_, peak, err := p.memory()
	if err != nil {
		return err
	}
	run.PeakMiB = peak
	if page, err = p.metrics(ctx); err != nil {
		return err
	}
	syncAfter, err := parseBuckets(page, syncMetric)
	if err != nil {
		return err
	}
	progAfter, err := parseBuckets(page, progMetric)
	if err != nil {
		return err
	}
	run.SyncP99Bucket = 1000 * bucketQuantile(syncBefore, syncAfter, 0.99)
	run.ProgP50Bucket = 1000 * bucketQuantile(progBefore, progAfter, 0.5)
	run.ProgP99Bucket = 1000 * bucketQuantile(progBefore, progAfter, 0.99)
	took, err := syncTimes(logPath, began, churnEnd)
	if err != nil {
		return err
	}
	run.Syncs = len(took)
	if len(took) > 0 {
		run.SyncP50MS, run.SyncP99MS, run.SyncMaxMS = quantile(took, 0.5), quantile(took, 0.99), quantile(took, 1)
	}
	run.Load = append(run.Load, loadAverage())
	res.Soak = run
	for _, line := range run.summary() {
		fmt.Println(line)
	}
	for _, e := range run.Examples {
		fmt.Println("failure:", e)
	}
	return nil
}

// zapISO8601 is the layout of the daemon's log timestamps
// (zapcore.ISO8601TimeEncoder).
const zapISO8601 = "2006-01-02T15:04:05.000Z0700"

// progMetric is the histogram of the time from a change seen to it being in
// the kernel.
const progMetric = "kubeproxy_network_programming_duration_seconds"

// soakChurn replaces endpoints at the set rate until ctx ends, and removes
// each replaced endpoint the grace period after the write that made it
// terminating. It counts the replacements it queued in changes. It keeps to
// the rate by the clock, making up for ticks a busy machine delays, but
// not for more than a second behind: a churn the writers cannot keep up
// with shows as a lower rate.
func soakChurn(ctx context.Context, m *soakModel, owners *addrOwners, w *soakWriters, history *addrHistory, recent *recentRing, so soakOptions, changes, terminating *atomic.Int64) error {
	defer func() { terminating.Store(int64(m.terminating)) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	type due struct {
		at   time.Time
		svc  int
		addr netip.Addr
	}
	var removals []due // in the order their grace started, nearly in time order
	remove := func(now time.Time) {
		for len(removals) > 0 && !removals[0].at.After(now) {
			d := removals[0]
			removals = removals[1:]
			// The pod exits, then its endpoint goes.
			owners.clear(d.addr)
			m.remove(d.svc, d.addr)
			history.add(d.addr, evPodExited, d.svc)
			w.queue(soakWrite{svc: d.svc, endpoints: m.endpoints(d.svc), removed: d.addr})
		}
	}
	began, skipped := time.Now(), int64(0)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case job := <-w.written:
			removals = append(removals, due{at: time.Now().Add(so.grace), svc: job.svc, addr: job.retiring})
		case now := <-tick.C:
			remove(now)
			terminating.Store(int64(m.terminating))
			owed := int64(now.Sub(began).Seconds()*float64(so.rate)) - skipped - changes.Load()
			if owed > int64(so.rate) {
				skipped += owed - int64(so.rate)
				owed = int64(so.rate)
			}
			for range owed {
				r, ok := m.replace()
				if !ok {
					return errors.New("churn: no endpoint to replace (address pool empty)")
				}
				owners.set(r.added, r.svc)
				history.add(r.added, evAddedQueued, r.svc)
				history.add(r.retiring, evRetiringQueued, r.svc)
				w.queue(soakWrite{svc: r.svc, endpoints: m.endpoints(r.svc), retiring: r.retiring, added: r.added})
				recent.push(r.svc)
				changes.Add(1)
			}
		}
	}
}

// soakWaitReady waits for nftproxy's first sync and for connections to the
// first, the middle and the last service to go through.
func soakWaitReady(ctx context.Context, p *proxyProcess, c *soakClients) error {
	began := time.Now()
	for {
		if p.exited() {
			return fmt.Errorf("nftproxy exited: %s", p.logTail(5))
		}
		if time.Since(began) > soakReadyTimeout {
			return fmt.Errorf("nftproxy not serving after %s: %s", soakReadyTimeout, p.logTail(5))
		}
		if h, err := p.scrape(ctx); err == nil && h.count > 0 {
			n := len(c.model)
			ok := true
			for _, svc := range []int{0, n / 2, n - 1} {
				probe := &soakClients{ns: c.ns, model: c.model, timeout: time.Second, failed: map[string]int{}}
				probe.connect(svc)
				ok = ok && probe.ok.Load() == 1
			}
			if ok {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// soakSample reads the daemon's RSS, goroutines and syncs.
func soakSample(ctx context.Context, p *proxyProcess, began time.Time, c *soakClients, changes int) (SoakPoint, error) {
	pt := SoakPoint{AtS: time.Since(began).Round(time.Second).Seconds(), Changes: changes, Connections: int(c.attempts.Load())}
	_, pt.Failed = c.failures()
	rss, _, err := p.memory()
	if err != nil {
		return pt, err
	}
	pt.RSSMiB = rss
	page, err := p.metrics(ctx)
	if err != nil {
		return pt, err
	}
	g, ok := parseGauge(page, "go_goroutines")
	if !ok {
		return pt, errors.New("read nftproxy metrics: no go_goroutines")
	}
	pt.Goroutines = int(g)
	h, err := parseHistogram(page, syncMetric)
	if err != nil {
		return pt, err
	}
	pt.Syncs = h.count
	return pt, nil
}

// liveHeap asks the daemon for a collection and returns its heap right
// after, in MiB. The heap profile that comes with the collection is saved
// to profile unless that is empty (`go tool pprof -base START END` shows
// what grew).
func liveHeap(ctx context.Context, p *proxyProcess, profile string) (float64, error) {
	prof, err := p.get(ctx, "/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, err
	}
	if profile != "" {
		if err := os.WriteFile(profile, []byte(prof), 0o644); err != nil {
			return 0, fmt.Errorf("write heap profile: %w", err)
		}
	}
	page, err := p.metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := parseGauge(page, "go_memstats_heap_alloc_bytes")
	if !ok {
		return 0, errors.New("read nftproxy metrics: no go_memstats_heap_alloc_bytes")
	}
	return v / (1 << 20), nil
}

// syncTimes returns the took of every sync the daemon logged between from
// and to, in milliseconds.
func syncTimes(logPath string, from, to time.Time) ([]float64, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, fmt.Errorf("read nftproxy log: %w", err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), `"msg":"Synced"`) {
			continue
		}
		var l struct {
			TS   string  `json:"ts"`
			Took float64 `json:"took"` // seconds
		}
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("parse nftproxy log: %w", err)
		}
		ts, err := time.Parse(zapISO8601, l.TS)
		if err != nil {
			return nil, fmt.Errorf("parse nftproxy log: %w", err)
		}
		if ts.Before(from) || ts.After(to) {
			continue
		}
		out = append(out, l.Took*1000)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read nftproxy log: %w", err)
	}
	return out, nil
}
