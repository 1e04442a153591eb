package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

type options struct {
	quick          bool
	sizes          []int
	runs           int
	phases         []string
	docs           string
	render         string
	results        string
	nftproxy       string
	iptNftSync     int            // largest size iptables-nft-restore loads in full
	iptNftFull     int            // largest size iptables-nft-restore full-table updates are timed at
	iptNftPartial  int            // largest size its partial updates are timed at
	samples        int            // connect samples per target
	daemonMax      int            // largest size the daemon is started at
	daemonProfiles string         // where heap profiles of the daemon go; none when empty
	daemonOne      []int          // sizes the daemon also runs with one endpoint per service
	workloads      []string       // the peers phase's workloads
	proxies        []string       // the peers phase's proxies
	proxiesGiven   bool           // --proxies was set: run them on every workload
	stepLimit      time.Duration  // a proxy's step stopped after this long
	writeLimit     time.Duration  // a workload not stored after this long is not run
	peerRuns       int            // runs of each proxy on a workload; figures are their medians
	checkpoint     func(*Results) // saves what was measured so far
	soak           soakOptions

	childSync     int
	childMemstats bool
}

var allPhases = []string{"sync", "updates", "dataplane", "daemon", "gobench", "peers"}

// soakPhaseName is a phase only named runs make (`make soak`): it takes
// minutes by design.
const soakPhaseName = "soak"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// rawFlags are the flags parsed into options after the flag set is done.
type rawFlags struct {
	sizes, phases, daemonOne, workloads, proxies, soakSource *string
}

// defineFlags defines the bench's flags on fs, into o and the returned
// strings.
func defineFlags(fs *flag.FlagSet, o *options) rawFlags {
	fs.BoolVar(&o.quick, "quick", false, "stop at 10,000 services")
	var r rawFlags
	r.sizes = fs.String("sizes", "", "comma-separated service counts (default 1000,5000,10000,30000,50000; --quick stops at 10000)")
	fs.IntVar(&o.runs, "runs", 3, "runs of each measurement; tables show the minimum and the median")
	r.phases = fs.String("phases", strings.Join(allPhases, ","), "what to measure: "+strings.Join(allPhases, ",")+" (or "+soakPhaseName+", run only when named)")
	fs.StringVar(&o.docs, "docs", "docs", "directory benchmarks.md and the plots are written to")
	fs.StringVar(&o.render, "render", "", "only rewrite the docs from this results file")
	fs.StringVar(&o.results, "results", "cmd/bench/results.json", "file the raw results are written to")
	fs.StringVar(&o.nftproxy, "nftproxy", "bin/nftproxy", "the nftproxy binary, for the daemon's resident memory")
	fs.IntVar(&o.iptNftSync, "iptables-nft-max-sync", 50000, "largest size iptables-nft-restore loads in full")
	fs.IntVar(&o.iptNftFull, "iptables-nft-max-full-update", 1000, "largest size iptables-nft-restore full-table updates are timed at")
	fs.IntVar(&o.iptNftPartial, "iptables-nft-max-partial", 10000, "largest size iptables-nft-restore --noflush partial updates are timed at")
	fs.IntVar(&o.samples, "samples", 1000, "TCP connects timed per target service")
	fs.IntVar(&o.daemonMax, "daemon-max", 50000, "largest size nftproxy run is started at")
	fs.StringVar(&o.daemonProfiles, "daemon-profiles", "", "directory the daemon's heap profile at steady state is saved to, one per size (none when empty)")
	r.daemonOne = fs.String("daemon-one-endpoint", "100000", "comma-separated service counts the daemon phase also runs with one endpoint per service (none when empty or --quick)")
	r.workloads = fs.String("workloads", "", "peers phase: comma-separated workloads, of "+workloadNames()+" (default: "+strings.Join(defaultWorkloads(false), ",")+"; --quick: "+strings.Join(defaultWorkloads(true), ",")+")")
	r.proxies = fs.String("proxies", "", "peers phase: comma-separated proxies, of "+strings.Join(allProxies, ",")+" (default: all; 30kx3 and 100kx3 run nftproxy alone unless this is given)")
	fs.DurationVar(&o.writeLimit, "write-limit", 20*time.Minute, "peers phase: a workload the API server has not stored after this long is reported as not run (its Service creates cost it O(services): 100,000 take over an hour)")
	fs.IntVar(&o.peerRuns, "peer-runs", 1, "peers phase: runs of each proxy on a workload; the tables show the median (kube-proxy's iptables modes take minutes a run at 10k services)")
	fs.DurationVar(&o.stepLimit, "step-limit", 5*time.Minute, "peers phase: a proxy that has not finished a step after this long is reported over it and stopped")
	fs.DurationVar(&o.soak.duration, "soak-duration", 10*time.Minute, "soak phase: how long the churn runs")
	fs.IntVar(&o.soak.services, "soak-services", 10000, "soak phase: services, of 3 endpoints each")
	fs.IntVar(&o.soak.rate, "soak-rate", 200, "soak phase: endpoint replacements a second")
	fs.IntVar(&o.soak.connRate, "soak-conn-rate", 100, "soak phase: client connections a second")
	fs.DurationVar(&o.soak.grace, "soak-grace", 10*time.Second, "soak phase: how long a replaced endpoint stays terminating before its pod exits and it is removed")
	fs.StringVar(&o.soak.profiles, "soak-profiles", "", "soak phase: directory the daemon's heap profiles at idle, start and end are saved to (none when empty)")
	r.soakSource = fs.String("soak-source", "api", "soak phase: where nftproxy reads the objects, api (a real kube-apiserver) or manifests (a directory)")
	fs.IntVar(&o.childSync, "child-sync", 0, "internal: sync this many services in the current namespace and exit")
	fs.BoolVar(&o.childMemstats, "child-memstats", false, "internal: --child-sync reports its live heap")
	return r
}

// parseOptions reads the command line; nil options and no error is -help.
func parseOptions(args []string) (*options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	r := defineFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, err
	}
	var err error
	if o.sizes, err = parseSizes(*r.sizes, o.quick); err != nil {
		return nil, err
	}
	if o.peerRuns < 1 {
		return nil, fmt.Errorf("parse --peer-runs: %d is not a number of runs", o.peerRuns)
	}
	if *r.daemonOne != "" && !o.quick {
		if o.daemonOne, err = parseSizes(*r.daemonOne, false); err != nil {
			return nil, err
		}
	}
	if o.workloads, o.proxies, err = parsePeers(*r.workloads, *r.proxies, o.quick); err != nil {
		return nil, err
	}
	o.proxiesGiven = *r.proxies != ""
	if o.phases, err = knownList("phase", *r.phases, append(slices.Clip(allPhases), soakPhaseName), allPhases); err != nil {
		return nil, err
	}
	if *r.soakSource != "api" && *r.soakSource != "manifests" {
		return nil, fmt.Errorf("unknown --soak-source %q, want api or manifests", *r.soakSource)
	}
	o.soak.manifests = *r.soakSource == "manifests"
	if o.soak.rate <= 0 || o.soak.connRate <= 0 || o.soak.services < 3 || o.soak.duration <= 0 {
		return nil, errors.New("soak: --soak-rate, --soak-conn-rate and --soak-duration must be positive, --soak-services at least 3")
	}
	o.soak.command = strings.Join(append([]string{"go run ./cmd/bench"}, args...), " ")
	return &o, nil
}

func run(args []string) error {
	o, err := parseOptions(args)
	if o == nil {
		return err
	}
	if o.childSync > 0 {
		return childSync(o.childSync, o.childMemstats)
	}
	if o.render != "" {
		res, err := loadResults(o.render)
		if err != nil {
			return err
		}
		return writeDocs(res, o.docs)
	}
	if reason := netns.Usable(); reason != "" {
		return fmt.Errorf("cannot run: %s", reason)
	}
	if _, err := netns.CleanupStale(nsPrefix); err != nil {
		logf("removing stale namespaces: %v", err)
	}
	// A run of some phases, workloads or proxies keeps the saved figures of
	// the others; the peers phase saves after each proxy, so a run cut
	// short keeps what it finished. There may be no saved figures.
	path := o.results
	old, err := loadResults(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		// A results file that is there but can't be read would be
		// overwritten with this run's figures alone.
		return err
	}
	o.checkpoint = func(res *Results) {
		if err := mergeResults(old, res).save(path); err != nil {
			logf("saving results: %v", err)
		}
	}
	res, err := measure(o)
	if res == nil {
		return err
	}
	res = mergeResults(old, res)
	if serr := res.save(path); serr != nil {
		return errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("%w (partial results in %s)", err, path)
	}
	return writeDocs(res, o.docs)
}

func parseSizes(s string, quick bool) ([]int, error) {
	if s == "" {
		if quick {
			return []int{1000, 5000, 10000}, nil
		}
		return []int{1000, 5000, 10000, 30000, 50000}, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2*nodePortEvery || n > 100000 {
			return nil, fmt.Errorf("parse sizes: %q is not a service count in %d..100000", f, 2*nodePortEvery)
		}
		out = append(out, n)
	}
	return out, nil
}

// parsePeers checks --workloads and --proxies.
func parsePeers(workloads, proxies string, quick bool) (ws, ps []string, err error) {
	if ws, err = knownList("workload", workloads, strings.Split(workloadNames(), ","), defaultWorkloads(quick)); err != nil {
		return nil, nil, err
	}
	ps, err = knownList("proxy", proxies, allProxies, allProxies)
	return ws, ps, err
}

// knownList splits a comma-separated list and checks that each item is one
// of known; an empty list is def.
func knownList(what, list string, known, def []string) ([]string, error) {
	if list == "" {
		return def, nil
	}
	items := strings.Split(list, ",")
	for _, it := range items {
		if !slices.Contains(known, it) {
			return nil, fmt.Errorf("unknown %s %q, want some of %s", what, it, strings.Join(known, ","))
		}
	}
	return items, nil
}

// measure runs every phase at every size, smallest first, and returns what
// it measured even when a phase fails.
func measure(o *options) (*Results, error) {
	res := &Results{Started: time.Now().UTC(), Quick: o.quick, Runs: o.runs, Sizes: o.sizes}
	var err error
	if res.Machine, err = describeMachine(); err != nil {
		return nil, err
	}
	res.Load = append(res.Load, loadAverage())
	has := func(p string) bool { return slices.Contains(o.phases, p) }
	start := time.Now()
	defer func() { res.Duration = time.Since(start).Round(time.Second).String() }()
	for _, n := range o.sizes {
		if has("sync") {
			if err := syncPhase(res, o, n); err != nil {
				return res, fmt.Errorf("full syncs of %d services: %w", n, err)
			}
		}
		if has("updates") {
			if err := updatePhase(res, o, n); err != nil {
				return res, fmt.Errorf("updates at %d services: %w", n, err)
			}
		}
	}
	for _, ph := range []struct {
		name string
		run  func(*Results, *options) error
	}{{"dataplane", dataplanePhase}, {"daemon", daemonPhase}, {"gobench", goBenchPhase}, {"peers", peersPhase}, {soakPhaseName, soakPhase}} {
		if !has(ph.name) {
			continue
		}
		if err := ph.run(res, o); err != nil {
			return res, fmt.Errorf("%s: %w", ph.name, err)
		}
	}
	res.Load = append(res.Load, loadAverage())
	return res, nil
}

func syncPhase(res *Results, o *options, n int) error {
	logf("full sync, %d services: nftproxy", n)
	if err := fullSyncNftproxy(res, n, o.runs); err != nil {
		return err
	}
	logf("full sync, %d services: nft -f", n)
	if err := fullSyncNftText(res, n, o.runs); err != nil {
		return err
	}
	logf("full sync, %d services: %s", n, legacy.restore)
	if err := fullSyncIptables(res, legacy, n, o.runs); err != nil {
		return err
	}
	if skipAbove(res, n, o.iptNftSync, "iptables-nft-max-sync", []string{metricFullSync}, iptNft.full) {
		return nil
	}
	runs := o.runsAt(n) // minutes each
	logf("full sync, %d services: %s (runs: %d)", n, iptNft.restore, runs)
	return fullSyncIptables(res, iptNft, n, runs)
}

func updatePhase(res *Results, o *options, n int) error {
	logf("updates, %d services: nftproxy and nft -f", n)
	if err := res.whole(func(s *Results) error { return nftproxyUpdates(s, n, o.runs) }); err != nil {
		return err
	}
	runs := o.runsAt(n) // tens of seconds each
	logf("updates, %d services: %s (runs: %d)", n, legacy.restore, runs)
	if err := res.whole(func(s *Results) error { return iptablesUpdates(s, legacy, n, runs, true) }); err != nil {
		return err
	}
	updates := []string{metricEndpointChange, metricServiceAdded}
	if skipAbove(res, n, o.iptNftPartial, "iptables-nft-max-partial", updates, iptNft.partial, iptNft.full) {
		return nil
	}
	full := !skipAbove(res, n, o.iptNftFull, "iptables-nft-max-full-update", updates, iptNft.full)
	logf("updates, %d services: %s (runs: 1)", n, iptNft.restore)
	return res.whole(func(s *Results) error { return iptablesUpdates(s, iptNft, n, 1, full) })
}

// runsAt is the runs of a slow tool at n services: one above 10,000.
func (o *options) runsAt(n int) int {
	if n > 10000 {
		return 1
	}
	return o.runs
}

// skipAbove records the metrics of methods as not run at n when n is above
// the limit that flag sets, and reports whether it did.
func skipAbove(res *Results, n, limit int, flag string, metrics []string, methods ...string) bool {
	if n <= limit {
		return false
	}
	why := fmt.Sprintf("not run above %d services (--%s)", limit, flag)
	for _, metric := range metrics {
		for _, method := range methods {
			res.skip(n, metric, method, why)
		}
	}
	return true
}
