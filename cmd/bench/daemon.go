package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/manifest"
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
	for _, n := range o.sizes {
		if skipAbove(res, n, o.daemonMax, "daemon-max", []string{metricDaemonRSS}, methodDaemon) {
			continue
		}
		if err := res.whole(func(s *Results) error { return runDaemon(s, o, n, endpointsPerService) }); err != nil {
			return err
		}
	}
	for _, n := range o.daemonOne {
		if err := res.whole(func(s *Results) error { return runDaemon(s, o, n, 1) }); err != nil {
			return err
		}
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

// daemonManifests are the daemon's manifest files: every service but one in
// one file, and the service whose endpoint the steps replace in a file of
// its own, so that a step rewrites (and the daemon reads again) one service.
type daemonManifests struct {
	stepFile string
	versions [2]*k8s.Snapshot // the step file's two contents
}

func writeDaemonManifests(dir string, n, eps int) (daemonManifests, error) {
	all := snapshot(n, nil)
	for i := range all.Services {
		all.Services[i].Endpoints = all.Services[i].Endpoints[:eps]
	}
	step := n / 2
	rest := &k8s.Snapshot{Services: append(slices.Clone(all.Services[:step]), all.Services[step+1:]...)}
	m := daemonManifests{stepFile: filepath.Join(dir, "step.yaml")}
	m.versions = [2]*k8s.Snapshot{{Services: all.Services[step : step+1]},
		withEndpointChanged(&k8s.Snapshot{Services: all.Services[step : step+1]}, 0, replacementEndpoint(0))}
	if err := writeManifests(filepath.Join(dir, "services.yaml"), rest); err != nil {
		return m, err
	}
	return m, writeManifests(m.stepFile, m.versions[0])
}

// runDaemon runs the daemon once on n services of eps endpoints and records
// its figures. With --daemon-profiles it also saves the daemon's heap
// profile at steady state there, as daemon-heap-N.pb.gz (`go tool pprof`
// reads it).
func runDaemon(res *Results, o *options, n, eps int) error {
	logf("daemon, %d services x %d endpoints", n, eps)
	dir, err := os.MkdirTemp("", "nftproxy-bench-manifests-")
	if err != nil {
		return fmt.Errorf("make manifest directory: %w", err)
	}
	defer os.RemoveAll(dir)
	m, err := writeDaemonManifests(dir, n, eps)
	if err != nil {
		return err
	}
	d := &daemonRun{res: res, n: n, eps: eps}
	err = freshNS(func(ns *netns.NS) error {
		start := time.Now()
		p, err := startProxy("nftproxy", ns, nil, o.nftproxy, "run", "--manifests", dir,
			"--hostname-override", "node-1", "--node-ip", netns.NodeAddr.String(), "--cluster-cidr", clusterCIDR.String(),
			"--sync-period", daemonSyncPeriod.String(), "--metrics-bind-address", metricsAddr, "-v", "2",
			"--profiling="+strconv.FormatBool(o.daemonProfiles != ""))
		if err != nil {
			return err
		}
		defer p.Terminate(10 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), daemonSyncTimeout)
		defer cancel()
		d.p, d.ctx = p, ctx
		if err := d.measure(start, m); err != nil {
			return err
		}
		// The Go heap at steady state, garbage not yet collected included.
		heap, err := p.heapMiB(ctx)
		if err != nil {
			return err
		}
		d.add(metricDaemonHeap, methodDaemon, heap)
		if o.daemonProfiles == "" {
			return nil
		}
		_, err = p.liveHeap(ctx, filepath.Join(o.daemonProfiles, fmt.Sprintf("daemon-heap-%d.pb.gz", n)))
		return err
	})
	if err != nil {
		return fmt.Errorf("%d services: %w", n, err)
	}
	return nil
}

// daemonRun is one run of the daemon phase's nftproxy.
type daemonRun struct {
	res    *Results
	n, eps int
	p      *proxy
	ctx    context.Context
	// MiB: the highest VmHWM read, and VmHWM when the manifests were
	// loaded, before the first sync.
	peakMiB, loadPeakMiB float64
}

// add records one figure of the run.
func (d *daemonRun) add(metric, method string, v float64) {
	d.res.add(d.n, metric, daemonMethod(method, d.eps), v)
}

// measure waits for the first sync and the resyncs, reading the memory on
// the way, then times the endpoint steps.
func (d *daemonRun) measure(start time.Time, m daemonManifests) error {
	if err := d.waitSyncs(1); err != nil {
		return err
	}
	d.add(metricDaemonStart, methodDaemon, ms(time.Since(start)))
	time.Sleep(time.Second)
	if err := d.memory(methodDaemonFirst); err != nil {
		return err
	}
	released, err := logged(d.p.Log(), releasedLine)
	if err != nil {
		return err
	}
	if len(released) > 0 {
		d.add(metricDaemonRelease, methodDaemon, released[0].tookMS)
	}
	if err := d.waitSyncs(1 + daemonResyncs); err != nil {
		return err
	}
	time.Sleep(time.Second)
	if err := d.memory(methodDaemon); err != nil {
		return err
	}
	syncs, err := logged(d.p.Log(), syncedLine)
	if err != nil {
		return err
	}
	d.add(metricDaemonFullSync, methodDaemon, syncs[0].tookMS)
	if err := d.endpointSteps(m, len(syncs)); err != nil {
		return err
	}
	d.add(metricDaemonPeak, methodDaemon, d.peakMiB)
	if d.loadPeakMiB > 0 {
		d.add(metricDaemonPeak, methodDaemonLoaded, d.loadPeakMiB)
	}
	return nil
}

// memory reads the resident memory, as the figure of method unless that is
// empty, and VmHWM, keeping the highest: a later VmHWM was seen lower than an
// earlier one (41 MiB after 42 at 1,000 services; the kernel's RSS counters
// are per CPU and read approximately), and a reading is at least the RSS of
// its moment.
func (d *daemonRun) memory(method string) error {
	rss, peak, err := d.p.Memory()
	if err != nil {
		return err
	}
	d.peakMiB = max(d.peakMiB, peak)
	if method != "" {
		d.add(metricDaemonRSS, method, rss)
	}
	return nil
}

// endpointSteps replaces one endpoint, back and forth: each rewrite is one
// delta sync, logged with what it took, counted from the syncs so far (a
// sync of nothing may follow the first one: a late signal of the source).
func (d *daemonRun) endpointSteps(m daemonManifests, synced int) error {
	var took []float64
	for i := range daemonEndpointSteps {
		// Written aside and renamed into place, as kubelet updates a
		// mounted ConfigMap: the daemon never reads half a file.
		if err := writeManifests(m.stepFile+".new", m.versions[(i+1)%2]); err != nil {
			return err
		}
		if err := os.Rename(m.stepFile+".new", m.stepFile); err != nil {
			return fmt.Errorf("replace %s: %w", m.stepFile, err)
		}
		if err := d.waitLines(synced+i+1, syncedLine); err != nil {
			return err
		}
		syncs, err := logged(d.p.Log(), syncedLine)
		if err != nil {
			return err
		}
		took = append(took, syncs[synced+i].tookMS)
	}
	d.add(metricDaemonEndpoint, methodDaemon, quantile(took, 0.5))
	return nil
}

// waitSyncs waits for want syncs, skipped periodic resyncs included.
func (d *daemonRun) waitSyncs(want int) error {
	return d.waitLines(want, syncedLine, resyncSkippedLine)
}

// waitLines waits until the daemon's log holds want lines of the patterns,
// reading the peak at every poll. The daemon logs one JSON line per sync,
// and with -v 2 one per periodic resync it skipped, and one when it loaded
// the manifests: the peak then is decoding's, before the first sync (which
// starts at once, so up to one poll of it may count).
func (d *daemonRun) waitLines(want int, patterns ...string) error {
	for {
		log := d.p.Log()
		n := 0
		for _, p := range patterns {
			n += strings.Count(log, p)
		}
		if n >= want {
			return nil
		}
		if d.memory("") == nil && d.loadPeakMiB == 0 && strings.Contains(log, `"msg":"Loaded manifests"`) {
			d.loadPeakMiB = d.peakMiB
		}
		if d.p.Exited() {
			return fmt.Errorf("nftproxy exited: %s", d.p.LogTail(5))
		}
		select {
		case <-d.ctx.Done():
			return fmt.Errorf("wait for nftproxy's sync %d: %w; its log ends: %s", want, d.ctx.Err(), d.p.LogTail(3))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writeManifests writes the snapshot's services as Service and EndpointSlice
// manifests, in one file.
func writeManifests(path string, snap *k8s.Snapshot) error {
	var b strings.Builder
	for _, sp := range snap.Services {
		ms := manifest.Service{Namespace: sp.Name.Namespace, Name: sp.Name.Name, ClusterIP: sp.ClusterIPs[0].String(), Proto: "TCP",
			PortName: sp.Name.Port, Port: int(sp.Port), TargetPort: endpointPort, NodePort: int(sp.NodePort),
			Slice: sp.Name.Name + "-bench", ManagedBy: benchManagedBy,
			Endpoint: "  conditions: {ready: true, serving: true, terminating: false}\n"}
		for _, e := range sp.Endpoints {
			ms.Endpoints = append(ms.Endpoints, e.Addr.String())
		}
		b.WriteString(ms.YAML())
		b.WriteString("---\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write manifests: %w", err)
	}
	return nil
}
