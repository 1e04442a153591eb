package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// The peers phase: nftproxy against the real kube-proxy, each run alone in
// a fresh network namespace against the same API server state.
//
// For each workload the phase starts a fresh etcd and kube-apiserver on
// loopback and writes the workload through client-go. Then, one proxy at a
// time, it makes a namespace, relays 127.0.0.1:PORT inside it to the API
// server, starts the proxy there and measures three steps: the full sync at
// start-up, one endpoint replaced, one service added. After each proxy it
// puts the API state back, stops the proxy and deletes the namespace (its
// rules go with it); after each workload it stops the API server.

// Timing of the steps.
const (
	// scrapeEvery is how often /metrics is read while waiting for a sync.
	scrapeEvery = 50 * time.Millisecond
	// settle is how long the histogram must stay unchanged before a step
	// counts as done: more than kube-proxy's and nftproxy's 1 s
	// min-sync-period, so a sync the step caused late is still counted.
	settle = 2 * time.Second
)

// peerEnv is what every proxy run of a workload shares.
type peerEnv struct {
	o         *options
	kubeProxy string              // its binary
	env       map[string][]string // of a proxy; nil: the bench's
	tmp       string              // kubeconfigs, iptables link directories
	cluster   *cluster
	w         *workload
	run       *PeerRun
	runIndex  int // counts proxy runs: each adds its own service and endpoint
	saved     func()
}

func peersPhase(res *Results, o *options) error {
	run := &PeerRun{Started: time.Now().UTC(), Quick: o.quick, LimitMS: ms(o.stepLimit), Load: []string{loadAverage()}}
	res.Peers = run
	start := time.Now()
	defer func() {
		run.Duration = time.Since(start).Round(time.Second).String()
		run.Load = append(run.Load, loadAverage())
	}()
	kubeProxy := filepath.Join(apiserver.DefaultBinDir(), "kube-proxy")
	if _, err := os.Stat(kubeProxy); err != nil && slices.ContainsFunc(o.proxies, func(p string) bool { return p != proxyNftproxy }) {
		return fmt.Errorf("find kube-proxy (make k8s-bins): %w", err)
	}
	if _, err := os.Stat(o.nftproxy); err != nil {
		return fmt.Errorf("find nftproxy (make build): %w", err)
	}
	tmp, err := os.MkdirTemp("", "nftproxy-bench-peers-")
	if err != nil {
		return fmt.Errorf("make scratch directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	e := &peerEnv{o: o, kubeProxy: kubeProxy, tmp: tmp, run: run, env: map[string][]string{}, saved: func() {
		if o.checkpoint != nil {
			o.checkpoint(res)
		}
	}}
	// kube-proxy's iptables mode runs the backend of the iptables first on
	// its PATH.
	for proxy, backend := range map[string]string{proxyKubeIptNft: "nft", proxyKubeLegacy: "legacy"} {
		links := filepath.Join(tmp, "links", backend)
		if err := e2e.IptablesTools(links, backend); err != nil {
			return err
		}
		e.env[proxy] = append(os.Environ(), "PATH="+links+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	for _, name := range o.workloads {
		spec, _ := findWorkload(name)
		if err := e.workload(spec); err != nil {
			return fmt.Errorf("workload %s: %w", name, err)
		}
	}
	return nil
}

// proxiesFor returns the proxies to run on a workload: those of --proxies,
// and of them only the workload's own when --proxies was not given.
func proxiesFor(spec workloadSpec, proxies []string, explicit bool) []string {
	if explicit || spec.proxies == nil {
		return proxies
	}
	return slices.DeleteFunc(slices.Clone(proxies), func(p string) bool { return !slices.Contains(spec.proxies, p) })
}

// workload measures every proxy on spec, saving the results after each.
func (e *peerEnv) workload(spec workloadSpec) error {
	proxies := proxiesFor(spec, e.o.proxies, e.o.proxiesGiven)
	if len(proxies) == 0 {
		return nil
	}
	w := spec.generate()
	services, nslices := w.objects()
	info := PeerWorkload{Name: spec.name, Title: spec.title, Services: services, Endpoints: w.endpoints(), Slices: nslices}
	logf("peers, %s: starting an API server, writing %d services and %d endpoint slices", spec.name, services, nslices)
	ctx := context.Background()
	c, err := startCluster(ctx)
	if err != nil {
		return err
	}
	defer c.stop()
	began := time.Now()
	loadCtx, cancel := context.WithTimeout(ctx, e.o.writeLimit)
	err = c.load(loadCtx, w)
	cancel()
	info.CreateS = int(time.Since(began).Seconds())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// Bounded like a proxy's step: the run goes on with the next
		// workload.
		info.NotLoaded = fmt.Sprintf("Not run: the API server had not stored the workload after %s (%v).", e.o.writeLimit, err)
		logf("peers, %s: %s", spec.name, info.NotLoaded)
		e.run.setWorkload(info)
		e.saved()
		return nil
	case err != nil:
		return err
	}
	logf("peers, %s: written in %s", spec.name, time.Since(began).Round(time.Second))
	e.run.setWorkload(info)
	e.cluster, e.w = c, w
	for _, proxy := range proxies {
		for run := range e.o.peerRuns {
			of := "" // which run, when there are several
			if e.o.peerRuns > 1 {
				of = fmt.Sprintf(", run %d of %d", run+1, e.o.peerRuns)
			}
			logf("peers, %s: %s%s", spec.name, proxyTitle[proxy], of)
			if err := e.proxy(ctx, proxy); err != nil {
				return err
			}
		}
		e.run.fold(spec.name, proxy)
		e.saved()
	}
	// The bare watches beside every proxy's runs: the floor under all.
	e.run.fold(spec.name, proxyAPIWatch)
	e.saved()
	return nil
}

// errStep is a step that did not finish in time or failed in the proxy: the
// proxy's remaining figures are not measured, and the next proxy runs.
type errStep struct {
	metric string
	reason string
}

func (e *errStep) Error() string { return e.metric + ": " + e.reason }

// proxy measures one proxy on the current workload and records its figures.
// An error is returned only when the API state could not be prepared or put
// back; a proxy that fails or runs out of time is recorded as such.
func (e *peerEnv) proxy(ctx context.Context, proxy string) error {
	k := e.runIndex
	e.runIndex++
	// The service step's EndpointSlice is there before the proxy starts, so
	// that the step is the Service alone and no sync for a slice without
	// its service runs into it.
	if err := e.cluster.createSlice(ctx, addedServiceName(k), 0, addedEndpoints(k), e.w.spec.nodeOf); err != nil {
		return err
	}
	var step *errStep
	if err := e.measureProxy(ctx, proxy, k); errors.As(err, &step) {
		logf("  %s", step)
		e.run.failed(e.w.spec.name, proxy, step)
	} else if err != nil {
		return err
	}
	// Put the API state back as the workload wrote it, for the next run:
	// the step service's endpoint, and no k-th added service.
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	i := e.w.stepService()
	eps := e.w.services[i].endpoints
	if err := e.cluster.replaceEndpoint(rctx, e.w, i, eps[len(eps)-1], func() {}); err != nil {
		return err
	}
	return e.cluster.removeAdded(rctx, k)
}

func (e *peerEnv) measureProxy(ctx context.Context, proxy string, k int) error {
	return freshNS(func(ns *netns.NS) error {
		kubeconfig := filepath.Join(e.tmp, fmt.Sprintf("kubeconfig-%d", k))
		r, err := e.cluster.srv.Relay(ns, "", kubeconfig)
		if err != nil {
			return err
		}
		defer r.Close()
		p, err := startProxy(proxyTitle[proxy], ns, e.env[proxy], e.command(proxy, kubeconfig)...)
		if err != nil {
			return err
		}
		s := &stepper{peerEnv: e, p: p, ns: ns, name: proxy, k: k}
		err = s.steps(ctx)
		var step *errStep
		if errors.As(err, &step) && step.reason == overLimit {
			p.Kill() // stopped at the time limit, it may be in a long sync
		} else {
			p.Terminate(5 * time.Second)
		}
		return err
	})
}

// stepper runs the three steps of one proxy, the k-th run.
type stepper struct {
	*peerEnv
	p    *proxy
	ns   *netns.NS
	name string
	k    int
}

func (s *stepper) record(proxy, metric string, v float64, syncs int) {
	s.run.add(s.w.spec.name, proxy, metric, v, syncs)
}

func (s *stepper) steps(ctx context.Context) error {
	began := time.Now()
	// Full sync: the first sample of the histogram, with any that ended in
	// the same scrape interval.
	first, at, base, err := s.p.await(ctx, prom.Histogram{}, peerFullSync, s.o.stepLimit)
	if err != nil {
		return err
	}
	s.record(s.name, peerStart, ms(at.Sub(began)), 0)
	full := first.Histogram(syncMetric)
	s.record(s.name, peerFullSync, full.Sum*1000, full.Count)
	// The same scrape's whole syncs: the IPv4 series leaves out the IPv6
	// table, which kube-proxy syncs in a proxier of its own.
	if whole := first.Histogram(wholeSyncMetric); s.name == proxyNftproxy && whole.Count > 0 {
		s.record(s.name, peerFullWhole, whole.Sum*1000, whole.Count)
	}
	rss, _, err := s.p.Memory()
	if err != nil {
		return err
	}
	s.record(s.name, peerRSS, rss, 0)
	// The bare watches end with the steps.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, step := range s.changes(ctx) {
		if base, err = s.change(ctx, step, base); err != nil {
			return err
		}
	}
	_, peak, err := s.p.Memory()
	if err != nil {
		return err
	}
	s.record(s.name, peerPeak, peak, 0)
	return nil
}

// change makes one step's API write and times it: the wall time from the
// write to the change in the kernel; the proxy's own share of it, from the
// bare watch's event to the kernel; and the syncs the histogram gained from
// base until it settled, which it returns.
func (s *stepper) change(ctx context.Context, c peerChange, base prom.Histogram) (prom.Histogram, error) {
	var kernel *watcher
	var err error
	if s.name == proxyKubeLegacy {
		kernel = watchSave(s.ns, "iptables-legacy-save", c.kernel)
	} else if kernel, err = watchNft(s.ns, c.kernel); err != nil {
		return base, err
	}
	defer kernel.close()
	bare, err := s.cluster.watchStep(c)
	if err != nil {
		return base, err
	}
	defer bare.close()
	var t0 time.Time
	if err := c.write(func() { t0 = time.Now() }); err != nil {
		return base, err
	}
	wctx, cancel := context.WithDeadline(ctx, t0.Add(s.o.stepLimit))
	defer cancel()
	at, err := kernel.seen(wctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return base, &errStep{metric: c.wall, reason: overLimit}
	} else if err != nil {
		return base, err
	}
	watched, err := bare.seen(wctx)
	if err != nil {
		return base, err
	}
	s.record(s.name, c.wall, ms(at.Sub(t0)), 0)
	s.record(s.name, c.own, ms(at.Sub(watched)), 0)
	s.record(proxyAPIWatch, c.wall, ms(watched.Sub(t0)), 0)
	_, _, after, err := s.p.await(ctx, base, c.sync, s.o.stepLimit)
	if err != nil {
		return base, err
	}
	d := after.Sub(base)
	s.record(s.name, c.sync, d.Sum*1000, d.Count)
	return after, nil
}

// await scrapes until the histogram counts more than base, then until it
// has not changed for the settle time. It returns the first page that
// counted more, when it was read, and the settled histogram. Each of the
// two waits may take limit; metric names the step in an errStep.
func (p *proxy) await(ctx context.Context, base prom.Histogram, metric string,
	limit time.Duration) (prom.Families, time.Time, prom.Histogram, error) {
	var first prom.Families
	var at, since time.Time
	began, last := time.Now(), base
	for {
		if p.Exited() {
			return nil, at, base, &errStep{metric: metric, reason: "the proxy exited: " + firstLines(p.LogTail(5), 5)}
		}
		// A failed scrape is a proxy that has not opened its port yet, or
		// one too busy to answer in time.
		fams, err := p.scrape(ctx)
		now := time.Now()
		if h := fams.Histogram(syncMetric); err == nil && h.Count != last.Count {
			if first == nil {
				first, at, began = fams, now, now
			}
			last, since = h, now
		}
		if first != nil && now.Sub(since) >= settle {
			return first, at, last, nil
		}
		if now.Sub(began) > limit {
			return nil, at, base, &errStep{metric: metric, reason: overLimit}
		}
		select {
		case <-ctx.Done():
			return nil, at, base, ctx.Err()
		case <-time.After(scrapeEvery):
		}
	}
}
