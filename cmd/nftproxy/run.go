package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// runDaemon wires sources, the sync loop and the HTTP servers, and runs until
// ctx ends. The rules stay in the kernel when it returns.
func runDaemon(ctx context.Context, o *options, log *zap.Logger) error {
	setMemoryLimit(log)
	cfgs, err := o.compileConfigs()
	if err != nil {
		return err
	}
	if err := checkKernel(cfgs, o.conntrack, log); err != nil {
		return err
	}
	if err := initNode(o, log); err != nil {
		return err
	}
	if o.initOnly {
		log.Info("Node initialized and --init-only given: exiting")
		return nil
	}
	keepInvalidWhenLiberal(cfgs, log)
	metrics := newMetrics()
	tracker, err := newTracker(o, log, metrics)
	if err != nil {
		return err
	}
	health := newHealth(o, metrics)
	if err := serveStatus(ctx, o, log, metrics, health); err != nil {
		return err
	}

	conn, err := nftnl.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	enableLocalnet, err := routeLocalnet(conn, cfgs)
	if err != nil {
		return err
	}
	hc := proxier.NewHealthChecks(log, health, proxier.HealthCheckOptions{Configs: cfgs,
		LocalAddrs: conntrack.InterfaceAddrs, BindFailures: metrics.HealthCheckBindFailures})
	defer hc.Close()
	popts := proxier.Options{Configs: cfgs, MinSyncPeriod: o.minSyncPeriod, SyncPeriod: o.syncPeriod,
		Kernel: kernel(ctx, o, conn, len(cfgs), log), OwnPort: conn.OwnPort, Logger: log, Metrics: metrics, Health: health, HealthChecks: hc,
		ReleaseMemory: true, FullSyncMemoryFactor: fullSyncMemoryFactor()}
	if enableLocalnet != nil {
		popts.AfterSync = func() error { return enableLocalnet(log) }
	}
	if o.conntrack {
		ct, err := conntrack.Dial(0)
		if err != nil {
			return err
		}
		defer func() { _ = ct.Close() }()
		r := conntrack.NewReconciler(ct)
		r.LocalAddrs = conntrack.InterfaceAddrs
		popts.Flows = flowCleaner{r}
	}

	if err := leanLoad(log, func() error { return startSource(ctx, o, log, tracker) }); err != nil {
		if ctx.Err() != nil {
			// SIGTERM while waiting for the API server is a stop, not a
			// failure: nothing was applied and the previous rules stay.
			log.Info("Stopping before the first sync; the rules stay in place")
			return nil
		}
		return err
	}
	runSyncLoop(ctx, o, log, popts, tracker)
	log.Info("Stopping; the rules stay in place")
	return nil
}

// newMetrics is the registry /metrics serves: the proxier's, the build's
// and client-go's, which client-go reports through a global hook.
func newMetrics() *proxier.Metrics {
	metrics := proxier.NewMetrics()
	metrics.Registry.MustRegister(proxier.BuildInfo(version, commit))
	clientMetrics := k8s.NewClientMetrics()
	metrics.Registry.MustRegister(clientMetrics.Collectors()...)
	k8s.RegisterClientMetrics(clientMetrics)
	return metrics
}

// newHealth is /healthz's state, stale after two sync periods: one missed
// periodic sync is not yet a failure.
func newHealth(o *options, metrics *proxier.Metrics) *proxier.Health {
	health := proxier.NewHealth(2 * max(o.syncPeriod, time.Second))
	// kube-proxy reads its Node from the API server; without one /healthz fails.
	health.RequireNode = o.manifests == ""
	metrics.Registry.MustRegister(health.Collectors()...)
	return health
}

// keepInvalidWhenLiberal: kube-proxy drops packets conntrack calls invalid
// unless the kernel is liberal with TCP windows, whoever set that.
func keepInvalidWhenLiberal(cfgs []proxier.Config, log *zap.Logger) {
	if v, err := readSysctl("net/netfilter/nf_conntrack_tcp_be_liberal"); err == nil && v != 0 {
		log.Info("nf_conntrack_tcp_be_liberal set, not dropping packets conntrack calls invalid")
		for i := range cfgs {
			cfgs[i].DropInvalid = false
		}
	}
}

// serveStatus binds the healthz and metrics servers before anything else
// runs: a port in use is a start-up error, not a background one.
func serveStatus(ctx context.Context, o *options, log *zap.Logger, metrics *proxier.Metrics, health *proxier.Health) error {
	mux := http.NewServeMux()
	mux.Handle("/healthz", health.Healthz())
	mux.Handle("/livez", health.Livez())
	if err := serve(ctx, log, "healthz", o.healthzBindAddress, mux); err != nil {
		return err
	}
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	addStatusHandlers(metricsMux, o)
	if o.profiling {
		metricsMux.HandleFunc("/debug/pprof/", pprof.Index)
		metricsMux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		metricsMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metricsMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		metricsMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return serve(ctx, log, "metrics", o.metricsBindAddress, metricsMux)
}

// runSyncLoop runs the proxier until ctx ends. Other programs' changes to
// our tables are repaired at once, from nftables' notifications, not at the
// next --sync-period; without notifications only the period does it.
func runSyncLoop(ctx context.Context, o *options, log *zap.Logger, popts proxier.Options, tracker *k8s.Tracker) {
	log.Info("Starting sync loop", zap.Duration("minSyncPeriod", o.minSyncPeriod), zap.Duration("syncPeriod", o.syncPeriod))
	watcher, err := nftnl.NewWatcher(0)
	if err != nil {
		log.Error("Watching nftables notifications failed; drift is repaired every --sync-period only", zap.Error(err))
	} else {
		popts.Notifications = watcher
	}
	px := proxier.New(popts)
	if watcher != nil {
		go func() {
			if err := watcher.Run(ctx, px.Notify); err != nil && ctx.Err() == nil {
				log.Error("Reading nftables notifications failed; drift is repaired every --sync-period only", zap.Error(err))
			}
		}()
	}
	px.Run(ctx, tracker)
}

// initNode makes the start-up settings kube-proxy makes: oom_score_adj and
// conntrack tuning. route_localnet waits for the first sync (routeLocalnet).
func initNode(o *options, log *zap.Logger) error {
	setOOMScoreAdj(log, o.oomScoreAdj)
	if err := applySysctls(log, conntrackSysctls(o.ct, numCPU())); err != nil {
		return err
	}
	return nil
}

func newTracker(o *options, log *zap.Logger, metrics *proxier.Metrics) (*k8s.Tracker, error) {
	nodeIPs, err := o.parseNodeIPs()
	if err != nil {
		return nil, err
	}
	name := o.hostnameOverride
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("get hostname: %w", err)
		}
	}
	return k8s.NewTracker(log, k8s.TrackerOptions{
		FallbackNode: k8s.Node{Name: name, Addrs: nodeIPs},
		OnInvalid: func(kind, _, _ string, _ error) {
			metrics.InvalidObjects.WithLabelValues(kind).Inc()
		},
	}), nil
}

// startSource feeds the tracker from the manifest directory or the API
// server, and returns once the first complete state is in it.
func startSource(ctx context.Context, o *options, log *zap.Logger, tracker *k8s.Tracker) error {
	if o.manifests != "" {
		return k8s.WatchDir(ctx, o.manifests, tracker, log, 0)
	}
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" || o.kp.master != "" {
		cfg, err = clientcmd.BuildConfigFromFlags(o.kp.master, o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.UserAgent = "nftproxy"
	cfg.QPS, cfg.Burst, cfg.ContentType = float32(o.kubeAPIQPS), o.kubeAPIBurst, o.kubeAPIContentType
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	synced := k8s.RunInformersResync(ctx, client, tracker.NodeName(), o.configSyncPeriod, tracker, log)
	log.Info("Waiting for informers to sync")
	return k8s.WaitForSync(ctx, synced)
}

// addStatusHandlers serves kube-proxy's /proxyMode and /configz beside
// /metrics: the mode, and the configuration in use under its group's name.
func addStatusHandlers(mux *http.ServeMux, o *options) {
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprint(w, "nftables")
	})
	configz := map[string]kubeProxyConfiguration{"kubeproxy.config.k8s.io": effectiveConfig(o)}
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(configz)
	})
}

// serve listens on addr (nothing when empty) and serves mux until ctx ends.
func serve(ctx context.Context, log *zap.Logger, what, addr string, mux *http.ServeMux) error {
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for %s: %w", what, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server failed", zap.String("server", what), zap.Error(err))
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("Serving", zap.String("server", what), zap.String("address", l.Addr().String()))
	return nil
}
