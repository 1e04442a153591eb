package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
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

// soak is one run of the soak phase: the churned state, the pods, and
// nftproxy with its clients.
type soak struct {
	so      soakOptions
	run     *SoakRun
	w       *workload
	model   *soakModel
	owners  *addrOwners
	topo    *netns.Topology
	servers *soakServers
	tmp     string
	p       *proxy
	clients *soakClients
	history *addrHistory
	writers *soakWriters
	// The histograms at idle: the churn's figures are what it adds.
	syncBefore, progBefore prom.Histogram
	closers                []func() // run last to first
}

func soakPhase(res *Results, o *options) error {
	so := o.soak
	if _, err := os.Stat(o.nftproxy); err != nil {
		return fmt.Errorf("find nftproxy (make build): %w", err)
	}
	s := &soak{so: so, run: &SoakRun{Started: time.Now().UTC(), Command: so.command, Services: so.services, Endpoints: soakEndpoints,
		TargetRate: so.rate, GraceS: so.grace.Seconds(), ConnRate: so.connRate, Load: []string{loadAverage()}}}
	defer func() {
		for i := len(s.closers) - 1; i >= 0; i-- {
			s.closers[i]()
		}
	}()
	ctx := context.Background()
	if err := s.setUp(); err != nil {
		return err
	}
	sink, args, err := s.source(ctx, o.nftproxy)
	if err != nil {
		return err
	}
	if err := s.start(ctx, args); err != nil {
		return err
	}
	logf("soak: nftproxy synced %d services; idle: %s", so.services, s.run.Idle)
	began, err := s.churn(ctx, sink)
	if err != nil {
		return err
	}
	if err := s.finish(ctx, began); err != nil {
		return err
	}
	res.Soak = s.run
	for _, line := range s.run.summary() {
		fmt.Println(line)
	}
	for _, e := range s.run.Examples {
		fmt.Println("failure:", e)
	}
	return nil
}

// setUp builds the churned state, the topology and its pods.
func (s *soak) setUp() error {
	s.w = workloadSpec{name: "soak", services: s.so.services, width: uniform(soakEndpoints), unplaced: true}.generate()
	s.model = newSoakModel(s.w, soakPool, soakSeed)
	s.owners = newAddrOwners(soakPool)
	for i, svc := range s.model.services {
		for _, e := range svc.endpoints {
			s.owners.set(e.addr, i)
		}
	}
	var err error
	if s.topo, err = netns.BuildTopology(netns.TopologyOptions{Prefix: nsPrefix + "s", Pods: soakPods}); err != nil {
		return err
	}
	s.closers = append(s.closers, func() { _ = s.topo.Close() })
	s.servers, err = startSoakPods(s.topo, s.owners)
	s.closers = append(s.closers, s.servers.close)
	if err != nil {
		return err
	}
	if s.tmp, err = os.MkdirTemp("", "nftproxy-soak-"); err != nil {
		return fmt.Errorf("make scratch directory: %w", err)
	}
	s.closers = append(s.closers, func() { os.RemoveAll(s.tmp) })
	return nil
}

// source writes the services where nftproxy reads them, and returns where
// the churn writes and nftproxy's command line.
func (s *soak) source(ctx context.Context, binary string) (soakSink, []string, error) {
	if !s.so.manifests {
		return s.apiSource(ctx, binary)
	}
	s.run.Source = soakSourceManifests
	dir := filepath.Join(s.tmp, "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("make manifest directory: %w", err)
	}
	ms := manifestSink{dir: dir}
	logf("soak: writing %d manifest files", len(s.model.services))
	for i := range s.model.services {
		if err := ms.write(ctx, &s.model.services[i], s.model.endpoints(i)); err != nil {
			return nil, nil, err
		}
	}
	return ms, append(nftproxyCommand(binary, "--manifests", dir), "--profiling"), nil
}

// apiSource starts an API server, writes the workload to it and relays it
// into nftproxy's namespace.
func (s *soak) apiSource(ctx context.Context, binary string) (soakSink, []string, error) {
	s.run.Source = soakSourceAPI
	c, err := startCluster(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.closers = append(s.closers, c.stop)
	services, slices := s.w.objects()
	logf("soak: writing %d services and %d endpoint slices to the API server", services, slices)
	began := time.Now()
	if err := c.load(ctx, s.w); err != nil {
		return nil, nil, err
	}
	s.run.CreateRate = float64(services+slices) / time.Since(began).Seconds()
	logf("soak: written in %s (%.0f objects/s)", time.Since(began).Round(time.Second), s.run.CreateRate)
	kubeconfig := filepath.Join(s.tmp, "kubeconfig")
	relay, err := c.srv.Relay(s.topo.Node, "", kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	s.closers = append(s.closers, relay.Close)
	return apiSink{client: c.client}, append(nftproxyCommand(binary, "--kubeconfig", kubeconfig), "--profiling"), nil
}

// start runs nftproxy, waits for it to serve, and reads it at idle.
func (s *soak) start(ctx context.Context, args []string) error {
	p, err := startProxy("nftproxy", s.topo.Node, nil, args...)
	if err != nil {
		return err
	}
	s.p = p
	s.closers = append(s.closers, func() { p.stop(false, 5*time.Second) })
	s.clients = &soakClients{ns: s.topo.Client, model: s.model.services, recent: newRecentRing(soakRecentChanges),
		rate: s.so.connRate, timeout: soakConnTimeout, failed: map[string]int{}}
	if err := soakWaitReady(ctx, p, s.clients); err != nil {
		return err
	}
	fams, err := p.scrape(ctx)
	if err != nil {
		return err
	}
	s.syncBefore, s.progBefore = fams.Histogram(syncMetric), fams.Histogram(progMetric)
	if s.run.Idle, err = soakSample(ctx, p, time.Now(), s.clients, 0); err != nil {
		return err
	}
	s.run.Idle.LiveHeapMiB, err = p.liveHeap(ctx, s.so.profile("idle"))
	return err
}

// churn runs the churn, the clients and the samples for the duration, and
// returns when the churn began.
func (s *soak) churn(ctx context.Context, sink soakSink) (began time.Time, err error) {
	run, p := s.run, s.p
	cctx, cancel := context.WithTimeout(ctx, s.so.duration)
	defer cancel()
	s.history = newAddrHistory()
	s.writers = startSoakWriters(ctx, sink, s.model.services, soakWorkers, s.history)
	clientsDone := make(chan struct{})
	go func() { s.clients.run(cctx, soakInflight, soakSeed); close(clientsDone) }()
	began = time.Now()
	var changes, terminating atomic.Int64
	churnDone := make(chan error, 1)
	go func() {
		churnDone <- soakChurn(cctx, s.model, s.owners, s.writers, s.history, s.clients.recent, s.so, &changes, &terminating)
	}()
	warmup := min(s.so.duration/10, time.Minute)
	sampleTick := time.NewTicker(soakSampleEvery)
	defer sampleTick.Stop()
	warm := time.After(warmup)
	lagFrom := 0
	sample := func() (SoakPoint, error) {
		pt, err := soakSample(ctx, p, began, s.clients, int(changes.Load()))
		pt.Terminating = int(terminating.Load())
		pt.WriteLagMS, lagFrom = s.writers.lagSince(lagFrom)
		return pt, err
	}
	for done := false; !done; {
		select {
		case <-cctx.Done():
			done = true
		case <-warm:
			if run.Start, err = sample(); err != nil {
				return began, err
			}
			if run.Start.LiveHeapMiB, err = p.liveHeap(ctx, s.so.profile("start")); err != nil {
				return began, err
			}
			logf("soak: start (after %s of churn): %s", warmup, run.Start)
		case <-sampleTick.C:
			pt, err := sample()
			if err != nil {
				return began, err
			}
			run.Samples = append(run.Samples, pt)
			logf("soak: %s", pt)
		}
	}
	run.End, err = sample()
	run.DurationS = time.Since(began).Seconds()
	if err != nil {
		return began, err
	}
	if run.End.LiveHeapMiB, err = p.liveHeap(ctx, s.so.profile("end")); err != nil {
		return began, err
	}
	run.Samples = append(run.Samples, run.End)
	if err := <-churnDone; err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return began, err
	}
	<-clientsDone
	s.writers.close()
	run.Changes = int(changes.Load())
	return began, nil
}

// finish records the writes, the connections, the memory and the syncs of
// the churn.
func (s *soak) finish(ctx context.Context, began time.Time) error {
	run, w := s.run, s.writers
	run.Writes, run.WriteErrors = int(w.done.Load()), int(w.failed.Load())
	run.WriteP99MS = quantile(w.latency, 0.99)
	if w.firstErr != nil {
		run.FirstError = w.firstErr.Error()
	}
	run.FailedBy, run.Failed = s.clients.failures()
	run.Connections, run.Examples, run.DeadHits = int(s.clients.attempts.Load()), s.clients.examples, int(s.servers.dead.Load())
	s.servers.mu.Lock()
	dead := slices.Clone(s.servers.deadAddrs)
	s.servers.mu.Unlock()
	for _, d := range dead {
		run.Examples = append(run.Examples, fmt.Sprintf("%s a connection reached %s, where no pod runs; its history:", d.at.UTC().Format("15:04:05.000"), d.addr))
		run.Examples = append(run.Examples, s.history.describe(d.addr)...)
	}
	var err error
	if _, run.PeakMiB, err = s.p.Memory(); err != nil {
		return err
	}
	fams, err := s.p.scrape(ctx)
	if err != nil {
		return err
	}
	syncAfter, progAfter := fams.Histogram(syncMetric), fams.Histogram(progMetric)
	run.SyncP99Bucket = 1000 * prom.Quantile(s.syncBefore, syncAfter, 0.99)
	run.ProgP50Bucket = 1000 * prom.Quantile(s.progBefore, progAfter, 0.5)
	run.ProgP99Bucket = 1000 * prom.Quantile(s.progBefore, progAfter, 0.99)
	took, err := syncTimes(s.p.Log(), began, began.Add(time.Duration(run.DurationS*float64(time.Second))))
	if err != nil {
		return err
	}
	run.Syncs = len(took)
	if len(took) > 0 {
		run.SyncP50MS, run.SyncP99MS, run.SyncMaxMS = quantile(took, 0.5), quantile(took, 0.99), quantile(took, 1)
	}
	run.Load = append(run.Load, loadAverage())
	return nil
}

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
func soakWaitReady(ctx context.Context, p *proxy, c *soakClients) error {
	began := time.Now()
	for {
		if p.Exited() {
			return fmt.Errorf("nftproxy exited: %s", p.LogTail(5))
		}
		if time.Since(began) > soakReadyTimeout {
			return fmt.Errorf("nftproxy not serving after %s: %s", soakReadyTimeout, p.LogTail(5))
		}
		if h, err := p.histogram(ctx, syncMetric); err == nil && h.Count > 0 {
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
func soakSample(ctx context.Context, p *proxy, began time.Time, c *soakClients, changes int) (SoakPoint, error) {
	pt := SoakPoint{AtS: time.Since(began).Round(time.Second).Seconds(), Changes: changes, Connections: int(c.attempts.Load())}
	_, pt.Failed = c.failures()
	rss, _, err := p.Memory()
	if err != nil {
		return pt, err
	}
	pt.RSSMiB = rss
	h, err := p.histogram(ctx, syncMetric)
	if err != nil {
		return pt, err
	}
	pt.Syncs = h.Count
	g, err := p.gauge("go_goroutines")
	pt.Goroutines = int(g)
	return pt, err
}

// syncTimes returns the took of every sync the daemon logged between from
// and to, in milliseconds.
func syncTimes(log string, from, to time.Time) ([]float64, error) {
	syncs, err := logged(log, syncedLine)
	var out []float64
	for _, l := range syncs {
		if !l.at.Before(from) && !l.at.After(to) {
			out = append(out, l.tookMS)
		}
	}
	return out, err
}
