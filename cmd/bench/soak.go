package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
	binary  string // nftproxy's
	run     *SoakRun
	w       *workload
	model   *soakModel
	topo    *netns.Topology
	dead    eventLog[deadHit] // connections that reached an address with no pod
	tmp     string
	p       *proxy
	clients *soakClients
	writers *soakWriters
	began   time.Time // of the churn: the samples' time 0
	lagFrom int       // the writes the last sample's write lag covered
	// The histograms at idle: the churn's figures are what it adds.
	syncBefore, progBefore prom.Histogram
	closers                []func() // run last to first
}

func soakPhase(res *Results, o *options) error {
	so := o.soak
	if _, err := os.Stat(o.nftproxy); err != nil {
		return fmt.Errorf("find nftproxy (make build): %w", err)
	}
	s := &soak{so: so, binary: o.nftproxy, run: &SoakRun{Started: time.Now().UTC(), Command: so.command,
		Services: so.services, Endpoints: soakEndpoints, TargetRate: so.rate, GraceS: so.grace.Seconds(), ConnRate: so.connRate,
		Load: []string{loadAverage()}}}
	defer func() {
		for i := len(s.closers) - 1; i >= 0; i-- {
			s.closers[i]()
		}
	}()
	for _, step := range []func(context.Context) error{s.setUp, s.start, s.churn, s.finish} {
		if err := step(context.Background()); err != nil {
			return err
		}
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

// setUp builds the churned state, the topology, its pods and their clients.
func (s *soak) setUp(context.Context) error {
	s.w = workloadSpec{name: "soak", services: s.so.services, width: uniform(soakEndpoints), unplaced: true}.generate()
	s.model = newSoakModel(s.w, soakPool, soakSeed)
	var err error
	if s.topo, err = netns.BuildTopology(netns.TopologyOptions{Prefix: nsPrefix + "s", Pods: soakPods}); err != nil {
		return err
	}
	s.closers = append(s.closers, func() { _ = s.topo.Close() })
	s.clients = &soakClients{ns: s.topo.Client, services: s.w.services, recent: newRecentRing(soakRecentChanges),
		rate: s.so.connRate}
	if err = s.startPods(); err != nil {
		return err
	}
	if s.tmp, err = os.MkdirTemp("", "nftproxy-soak-"); err != nil {
		return fmt.Errorf("make scratch directory: %w", err)
	}
	s.closers = append(s.closers, func() { os.RemoveAll(s.tmp) })
	return nil
}

// manifestSource writes the services to a manifest directory, and returns
// it as where the churn writes, with nftproxy's flags to read it.
func (s *soak) manifestSource(ctx context.Context) (soakSink, []string, error) {
	s.run.Source = soakSourceManifests
	dir := filepath.Join(s.tmp, "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("make manifest directory: %w", err)
	}
	sink := manifestSink(dir)
	logf("soak: writing %d manifest files", len(s.w.services))
	for i := range s.w.services {
		if err := sink(ctx, &s.w.services[i], s.model.endpoints(i)); err != nil {
			return nil, nil, err
		}
	}
	return sink, []string{"--manifests", dir}, nil
}

// apiSource starts an API server, writes the workload to it and relays it
// into nftproxy's namespace, like manifestSource.
func (s *soak) apiSource(ctx context.Context) (soakSink, []string, error) {
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
	return apiSink(c.client), []string{"--kubeconfig", kubeconfig}, nil
}

// start writes the services where nftproxy reads them and starts the
// churn's writers there, then runs nftproxy, waits for it to serve, and
// reads it at idle.
func (s *soak) start(ctx context.Context) error {
	source := s.apiSource
	if s.so.manifests {
		source = s.manifestSource
	}
	sink, flags, err := source(ctx)
	if err != nil {
		return err
	}
	s.writers = startSoakWriters(ctx, sink, s.w.services, soakWorkers)
	s.closers = append(s.closers, s.writers.stop)
	p, err := startProxy("nftproxy", s.topo.Node, nil, append(nftproxyCommand(s.binary, flags...), "--profiling")...)
	if err != nil {
		return err
	}
	s.p = p
	s.closers = append(s.closers, func() { p.Terminate(5 * time.Second) })
	if err := s.waitReady(ctx); err != nil {
		return err
	}
	s.began = time.Now()
	if s.run.Idle, err = s.sample(ctx, "idle"); err != nil {
		return err
	}
	s.syncBefore, s.progBefore = p.fams.Histogram(syncMetric), p.fams.Histogram(progMetric)
	logf("soak: nftproxy synced %d services; idle: %s", s.so.services, s.run.Idle)
	return nil
}

// churn runs the churn, the clients and the samples for the duration.
func (s *soak) churn(ctx context.Context) error {
	run := s.run
	cctx, cancel := context.WithTimeout(ctx, s.so.duration)
	var wg sync.WaitGroup
	// A failed sample returns early: the clients and the churn stop before
	// the clean-up stops the writers they queue to.
	defer func() { cancel(); wg.Wait() }()
	s.began = time.Now()
	var churnErr error
	wg.Go(func() { s.clients.run(cctx, soakInflight, soakSeed) })
	wg.Go(func() { churnErr = s.replaceAtRate(cctx) })
	warmup := min(s.so.duration/10, time.Minute)
	sampleTick := time.NewTicker(soakSampleEvery)
	defer sampleTick.Stop()
	warm := time.After(warmup)
	var err error
	for done := false; !done; {
		select {
		case <-cctx.Done():
			done = true
		case <-warm:
			if run.Start, err = s.sample(ctx, "start"); err != nil {
				return err
			}
			logf("soak: start (after %s of churn): %s", warmup, run.Start)
		case <-sampleTick.C:
			pt, err := s.sample(ctx, "")
			if err != nil {
				return err
			}
			run.Samples = append(run.Samples, pt)
			logf("soak: %s", pt)
		}
	}
	run.DurationS = time.Since(s.began).Seconds()
	if run.End, err = s.sample(ctx, "end"); err != nil {
		return err
	}
	run.Samples = append(run.Samples, run.End)
	wg.Wait()
	if churnErr != nil && !errors.Is(churnErr, context.DeadlineExceeded) {
		return churnErr
	}
	s.writers.close(run)
	run.Changes = int(s.model.replaced.Load())
	return nil
}

// finish records the connections, the memory and the syncs of the churn.
func (s *soak) finish(ctx context.Context) error {
	run := s.run
	s.clients.report(run)
	dead, writes := s.dead.since(0), s.writers.done.since(0)
	run.DeadHits = len(dead)
	for _, d := range dead[:min(len(dead), soakFailureExamples)] {
		run.Examples = append(run.Examples, stamp(d.at)+" a connection reached "+d.addr.String()+", where no pod runs; its history:")
		run.Examples = append(run.Examples, describe(writes, d.addr)...)
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
	took, err := syncTimes(s.p.Log(), s.began, s.began.Add(time.Duration(run.DurationS*float64(time.Second))))
	if err != nil {
		return err
	}
	run.Syncs = len(took)
	run.SyncP50MS, run.SyncP99MS, run.SyncMaxMS = quantile(took, 0.5), quantile(took, 0.99), quantile(took, 1)
	run.Load = append(run.Load, loadAverage())
	return nil
}

// replaceAtRate replaces endpoints at the set rate until ctx ends, and
// removes each replaced endpoint the grace period after the write that made
// it terminating. It keeps to the rate by the clock, making up for ticks a
// busy machine delays, but not for more than a second behind: a churn the
// writers cannot keep up with shows as a lower rate.
func (s *soak) replaceAtRate(ctx context.Context) error {
	m, rate := s.model, int64(s.so.rate)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var grace []soakWrite // replacements written, in the order their grace started, nearly in time order
	began, skipped := time.Now(), int64(0)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case job := <-s.writers.written:
			grace = append(grace, job)
		case now := <-tick.C:
			for len(grace) > 0 && !grace[0].written.Add(s.so.grace).After(now) {
				r := grace[0]
				grace = grace[1:]
				m.remove(r.svc, r.retiring)
				s.writers.queue(soakChange{svc: r.svc, removed: r.retiring}, m.endpoints(r.svc))
			}
			owed := int64(now.Sub(began).Seconds()*float64(rate)) - skipped - m.replaced.Load()
			if owed > rate {
				skipped += owed - rate
				owed = rate
			}
			for range owed {
				c, ok := m.replace()
				if !ok {
					return errors.New("churn: no endpoint to replace (address pool empty)")
				}
				s.writers.queue(c, m.endpoints(c.svc))
				s.clients.recent.push(c.svc)
			}
		}
	}
}

// waitReady waits for nftproxy's first sync and for connections to the
// first, the middle and the last service to go through.
func (s *soak) waitReady(ctx context.Context) error {
	if _, _, _, err := s.p.await(ctx, prom.Histogram{}, "first sync", soakReadyTimeout); err != nil {
		return fmt.Errorf("wait for nftproxy: %w", err)
	}
	began, n := time.Now(), len(s.w.services)
	for _, svc := range []int{0, n / 2, n - 1} {
		for {
			if kind, _ := s.clients.ask(svc, time.Second); kind == "" {
				break
			}
			switch {
			case s.p.Exited():
				return fmt.Errorf("nftproxy exited: %s", s.p.LogTail(5))
			case time.Since(began) > soakReadyTimeout:
				return fmt.Errorf("nftproxy not serving after %s: %s", soakReadyTimeout, s.p.LogTail(5))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// sample reads the daemon's RSS, goroutines and syncs, and the churn's
// figures so far; at a point of the report (idle, start, end) also its
// live heap.
func (s *soak) sample(ctx context.Context, point string) (pt SoakPoint, err error) {
	c := s.clients
	pt = SoakPoint{AtS: time.Since(s.began).Round(time.Second).Seconds(), Changes: int(s.model.replaced.Load()),
		Connections: int(c.attempts.Load()), Failed: len(c.failed.since(0)), Terminating: int(s.model.terminating.Load())}
	pt.WriteLagMS, s.lagFrom = s.writers.lagSince(s.lagFrom)
	if pt.RSSMiB, _, err = s.p.Memory(); err != nil {
		return pt, err
	}
	fams, err := s.p.scrape(ctx)
	if err != nil {
		return pt, err
	}
	pt.Syncs = fams.Histogram(syncMetric).Count
	g, err := s.p.gauge("go_goroutines")
	pt.Goroutines = int(g)
	if err != nil || point == "" {
		return pt, err
	}
	profile := ""
	if s.so.profiles != "" {
		profile = filepath.Join(s.so.profiles, "soak-heap-"+point+".pb.gz")
	}
	pt.LiveHeapMiB, err = s.p.liveHeap(ctx, profile)
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
