package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
	"k8s.io/client-go/kubernetes"
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
	o        *options
	bin      peerBinaries
	env      map[string][]string // of a proxy; nil: the bench's
	tmp      string              // kubeconfigs, iptables link directories
	cluster  *cluster
	w        *workload
	run      *PeerRun
	runIndex int                   // counts proxy runs: each adds its own service and endpoint
	watcher  *kubernetes.Clientset // the bare watches' client, of cluster
}

func peersPhase(res *Results, o *options) error {
	run := &PeerRun{Started: time.Now().UTC(), Quick: o.quick, LimitMS: ms(o.stepLimit), Load: []string{loadAverage()}}
	res.Peers = run
	start := time.Now()
	defer func() {
		run.Duration = time.Since(start).Round(time.Second).String()
		run.Load = append(run.Load, loadAverage())
	}()
	bin, err := findPeerBinaries(o.nftproxy, slices.ContainsFunc(o.proxies, func(p string) bool { return p != proxyNftproxy }))
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "nftproxy-bench-peers-")
	if err != nil {
		return fmt.Errorf("make scratch directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	env := &peerEnv{o: o, bin: bin, tmp: tmp, run: run, env: map[string][]string{}}
	for proxy, backend := range map[string]string{proxyKubeIptNft: "nft", proxyKubeLegacy: "legacy"} {
		if env.env[proxy], err = iptablesEnv(filepath.Join(tmp, "links"), backend); err != nil {
			return err
		}
	}
	for _, name := range o.workloads {
		spec, _ := findWorkload(name)
		if err := env.workload(spec, func() {
			if o.checkpoint != nil {
				o.checkpoint(res)
			}
		}); err != nil {
			return fmt.Errorf("workload %s: %w", name, err)
		}
	}
	return nil
}

// peerBinaries are the proxies the peers phase runs.
type peerBinaries struct{ kubeProxy, nftproxy string }

func findPeerBinaries(nftproxy string, kubeProxy bool) (peerBinaries, error) {
	b := peerBinaries{kubeProxy: filepath.Join(apiserver.DefaultBinDir(), "kube-proxy"), nftproxy: nftproxy}
	if _, err := os.Stat(b.kubeProxy); err != nil && kubeProxy {
		return b, fmt.Errorf("find kube-proxy (make k8s-bins): %w", err)
	}
	if _, err := os.Stat(nftproxy); err != nil {
		return b, fmt.Errorf("find nftproxy (make build): %w", err)
	}
	return b, nil
}

// proxiesFor returns the proxies to run on a workload: those of --proxies,
// and of them only the workload's own when --proxies was not given.
func proxiesFor(spec workloadSpec, proxies []string, explicit bool) []string {
	if explicit || spec.proxies == nil {
		return proxies
	}
	var out []string
	for _, p := range proxies {
		if slices.Contains(spec.proxies, p) {
			out = append(out, p)
		}
	}
	return out
}

// workload measures every proxy on spec, calling saved after each.
func (e *peerEnv) workload(spec workloadSpec, saved func()) error {
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
	if err != nil && loadCtx.Err() != nil && ctx.Err() == nil {
		// Bounded like a proxy's step: the run goes on with the next
		// workload.
		info.NotLoaded = fmt.Sprintf("Not run: the API server had not stored the workload after %s (%v).", e.o.writeLimit, err)
		logf("peers, %s: %s", spec.name, info.NotLoaded)
		e.run.Workloads = replaceWorkload(e.run.Workloads, info)
		saved()
		return nil
	}
	if err != nil {
		return err
	}
	logf("peers, %s: written in %s", spec.name, time.Since(began).Round(time.Second))
	e.run.Workloads = replaceWorkload(e.run.Workloads, info)
	e.cluster, e.w, e.watcher = c, w, nil
	for _, proxy := range proxies {
		for run := range e.o.peerRuns {
			logf("peers, %s: %s%s", spec.name, proxyTitle[proxy], runOf(run, e.o.peerRuns))
			if err := e.proxy(ctx, proxy); err != nil {
				return err
			}
		}
		e.run.fold(spec.name, proxy)
		saved()
	}
	// The bare watches beside every proxy's runs: the floor under all.
	e.run.fold(spec.name, proxyAPIWatch)
	saved()
	return nil
}

// runOf names run (from 0) of runs in a log line; nothing for one run.
func runOf(run, runs int) string {
	if runs < 2 {
		return ""
	}
	return fmt.Sprintf(", run %d of %d", run+1, runs)
}

func replaceWorkload(ws []PeerWorkload, w PeerWorkload) []PeerWorkload {
	for i := range ws {
		if ws[i].Name == w.Name {
			ws[i] = w
			return ws
		}
	}
	return append(ws, w)
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
	if err := e.cluster.createAddedSlice(ctx, e.w, k); err != nil {
		return err
	}
	err := e.measureProxy(ctx, proxy, k)
	var step *errStep
	if errors.As(err, &step) {
		logf("  %s", step)
		for _, m := range []string{peerStart, peerFullSync, peerRSS, peerEndpointWal, peerEndpointOwn, peerEndpoint, peerServiceWall, peerServiceOwn, peerService, peerPeak} {
			if e.run.find(e.w.spec.name, proxy, m) == nil {
				if m == step.metric || (m == peerStart && step.metric == peerFullSync) {
					rec := PeerRecord{Workload: e.w.spec.name, Proxy: proxy, Metric: m, Skip: step.reason}
					if step.reason == overLimit {
						rec.Value = ms(e.o.stepLimit)
					}
					e.run.Records = append(e.run.Records, rec)
					continue
				}
				e.run.skip(e.w.spec.name, proxy, m, notMeasured+step.metric+" "+step.reason)
			}
		}
		err = nil
	}
	if err != nil {
		return err
	}
	return e.restore(ctx, k)
}

// restore puts the API state back as the workload wrote it, for the next
// run: the step service's endpoint, and no k-th added service.
func (e *peerEnv) restore(ctx context.Context, k int) error {
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	i := e.w.stepService()
	eps := e.w.services[i].endpoints
	if _, err := e.cluster.replaceEndpoint(rctx, e.w, i, eps[len(eps)-1], func() {}); err != nil {
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
		p, err := startProxy(proxyTitle[proxy], ns, e.env[proxy], proxyCommand(proxy, e.bin, kubeconfig)...)
		if err != nil {
			return err
		}
		killed := false
		defer func() { p.stop(killed, 5*time.Second) }()
		m := &stepper{env: e, p: p, ns: ns, proxy: proxy, limit: e.o.stepLimit}
		err = m.steps(ctx, k)
		var step *errStep
		if errors.As(err, &step) && step.reason == overLimit {
			killed = true
		}
		return err
	})
}

// stepper runs the three steps of one proxy.
type stepper struct {
	env   *peerEnv
	p     *proxy
	ns    *netns.NS
	proxy string
	limit time.Duration
}

func (s *stepper) record(metric string, v float64, syncs int) {
	s.env.run.add(s.env.w.spec.name, s.proxy, metric, v, syncs)
}

func (s *stepper) steps(ctx context.Context, k int) error {
	w := s.env.w
	began := time.Now()
	// Full sync: the first sample of the histogram, with any that ended in
	// the same scrape interval.
	first, at, err := s.waitSync(ctx, prom.Histogram{}, peerFullSync, began)
	if err != nil {
		return err
	}
	s.record(peerStart, ms(at.Sub(began)), 0)
	s.record(peerFullSync, first.Sum*1000, first.Count)
	if s.proxy == proxyNftproxy {
		// The same scrape's whole syncs: the IPv4 series leaves out the
		// IPv6 table, which kube-proxy syncs in a proxier of its own.
		if whole := s.p.fams.Histogram(wholeSyncMetric); whole.Count > 0 {
			s.record(peerFullWhole, whole.Sum*1000, whole.Count)
		}
	}
	base, err := s.settle(ctx, first, peerFullSync, time.Now())
	if err != nil {
		return err
	}
	rss, _, err := s.p.Memory()
	if err != nil {
		return err
	}
	s.record(peerRSS, rss, 0)

	// The bare watches end with the steps.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One endpoint replaced.
	addr := replacementEndpoint(k)
	base, err = s.change(ctx, kernelChange{addr: addr.As4(), text: "--to-destination " + netip.AddrPortFrom(addr, endpointPort).String()}, k, addr, base, func(before func()) error {
		_, err := s.env.cluster.replaceEndpoint(ctx, w, w.stepService(), addr, before)
		return err
	}, peerEndpoint, peerEndpointWal, peerEndpointOwn)
	if err != nil {
		return err
	}
	// One service added (its EndpointSlice is already there).
	ip := addedClusterIP(k)
	_, err = s.change(ctx, kernelChange{addr: ip.As4(), text: "-d " + ip.String() + "/32"}, k, netip.Addr{}, base, func(before func()) error {
		before()
		return s.env.cluster.createAddedService(ctx, k)
	}, peerService, peerServiceWall, peerServiceOwn)
	if err != nil {
		return err
	}
	_, peak, err := s.p.Memory()
	if err != nil {
		return err
	}
	s.record(peerPeak, peak, 0)
	return nil
}

// watch opens the kernel watch of the proxy's kind.
func (s *stepper) watch(c kernelChange) (kernelWatch, error) {
	if s.proxy == proxyKubeLegacy {
		return watchSave(s.ns, "iptables-legacy-save", c), nil
	}
	return watchNft(s.ns, c)
}

// change makes one step's API write (write calls before just before it)
// and times it: the wall time from the write to the change c in the kernel;
// the proxy's own share of it, from the bare watch's event (watchStep of k
// and addr) to the kernel; and the syncs the histogram gained until it
// settled.
func (s *stepper) change(ctx context.Context, c kernelChange, k int, addr netip.Addr, base prom.Histogram, write func(before func()) error, syncMetric, wallMetric, ownMetric string) (prom.Histogram, error) {
	watch, err := s.watch(c)
	if err != nil {
		return base, err
	}
	bare, err := s.env.watchStep(ctx, k, addr)
	if err != nil {
		watch.close()
		return base, err
	}
	var t0 time.Time
	if err := write(func() { t0 = time.Now() }); err != nil {
		watch.close()
		return base, err
	}
	wctx, cancel := context.WithDeadline(ctx, t0.Add(s.limit))
	defer cancel()
	at, err := watch.seen(wctx)
	watch.close()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return base, &errStep{metric: wallMetric, reason: overLimit}
		}
		return base, err
	}
	watched, err := bare.arrived(wctx)
	if err != nil {
		return base, err
	}
	s.record(wallMetric, ms(at.Sub(t0)), 0)
	s.record(ownMetric, ms(at.Sub(watched)), 0)
	s.env.run.add(s.env.w.spec.name, proxyAPIWatch, wallMetric, ms(watched.Sub(t0)), 0)
	after, err := s.settleAfter(ctx, base, syncMetric)
	if err != nil {
		return base, err
	}
	d := after.Sub(base)
	s.record(syncMetric, d.Sum*1000, d.Count)
	return after, nil
}

// settleAfter waits for at least one sync after base, then for the
// histogram to settle.
func (s *stepper) settleAfter(ctx context.Context, base prom.Histogram, metric string) (prom.Histogram, error) {
	began := time.Now()
	h, _, err := s.waitSync(ctx, base, metric, began)
	if err != nil {
		return base, err
	}
	return s.settle(ctx, h, metric, time.Now())
}

// waitSync scrapes until the histogram counts more than base, and returns
// it and when it was seen.
func (s *stepper) waitSync(ctx context.Context, base prom.Histogram, metric string, began time.Time) (prom.Histogram, time.Time, error) {
	for {
		h, ok, err := s.scrape(ctx, metric)
		if err != nil {
			return prom.Histogram{}, time.Time{}, err
		}
		if ok && h.Count > base.Count {
			return h, time.Now(), nil
		}
		if err := s.pause(ctx, metric, began); err != nil {
			return prom.Histogram{}, time.Time{}, err
		}
	}
}

// settle scrapes until the histogram has not changed for the settle time,
// and returns it.
func (s *stepper) settle(ctx context.Context, last prom.Histogram, metric string, began time.Time) (prom.Histogram, error) {
	since := time.Now()
	for time.Since(since) < settle {
		if err := s.pause(ctx, metric, began); err != nil {
			return last, err
		}
		h, ok, err := s.scrape(ctx, metric)
		if err != nil {
			return last, err
		}
		if ok && h.Count != last.Count {
			last, since = h, time.Now()
		}
	}
	return last, nil
}

// scrape reads the histogram; ok is false when /metrics did not answer (a
// proxy that has not opened its port yet, or too busy to answer in time).
func (s *stepper) scrape(ctx context.Context, metric string) (h prom.Histogram, ok bool, err error) {
	if s.p.Exited() {
		return h, false, &errStep{metric: metric, reason: "the proxy exited: " + firstLines(s.p.LogTail(5), 5)}
	}
	h, err = s.p.histogram(ctx, syncMetric)
	return h, err == nil, nil
}

func (s *stepper) pause(ctx context.Context, metric string, began time.Time) error {
	if time.Since(began) > s.limit {
		return &errStep{metric: metric, reason: overLimit}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(scrapeEvery):
		return nil
	}
}
