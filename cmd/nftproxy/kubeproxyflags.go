package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// kubeProxyFlags are kube-proxy v1.36's flags that nftproxy has no flag of
// its own for. Operators pass them in DaemonSets written for kube-proxy:
// each is accepted with kube-proxy's meaning where it has one in nftproxy,
// and otherwise warned about by name; none is ignored silently.
type kubeProxyFlags struct {
	proxyMode                  string
	healthzPort, metricsPort   int
	master                     string
	cleanup                    bool
	featureGates               string
	bindAddressHardFail        bool
	showHiddenMetrics          string
	iptablesSyncPeriod         time.Duration
	iptablesMinSyncPeriod      time.Duration
	ipvsSyncPeriod             time.Duration
	ipvsMinSyncPeriod          time.Duration
	iptablesLocalhostNodePorts bool
	// Flags of other modes or of logging that have no effect here: only
	// warned about.
	noEffect map[string]*string
}

// Defaults of kube-proxy's deprecated port flags.
const (
	defaultHealthzPort = 10256
	defaultMetricsPort = 10249
)

func (k *kubeProxyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.proxyMode, "proxy-mode", "", "kube-proxy's mode: nftables (what nftproxy does); iptables and ipvs are accepted with a warning and that mode's defaults (NodePorts on every address; iptables: NodePorts on 127.0.0.1 too); others are refused")
	fs.IntVar(&k.healthzPort, "healthz-port", defaultHealthzPort, "kube-proxy's deprecated port of the health server: 0 disables it; otherwise used only when --healthz-bind-address has no port, as in kube-proxy v1.36")
	fs.IntVar(&k.metricsPort, "metrics-port", defaultMetricsPort, "kube-proxy's deprecated port of the metrics server: 0 disables it; otherwise used only when --metrics-bind-address has no port, as in kube-proxy v1.36")
	fs.StringVar(&k.master, "master", "", "address of the API server, overriding the kubeconfig's, as kube-proxy's")
	fs.BoolVar(&k.cleanup, "cleanup", false, "remove nftproxy's tables and exit, as kube-proxy's --cleanup removes its own rules (nftproxy cleanup --kube-proxy removes kube-proxy's)")
	fs.StringVar(&k.featureGates, "feature-gates", "", "kube-proxy's feature gates: accepted, with a warning, as nftproxy has none")
	fs.BoolVar(&k.bindAddressHardFail, "bind-address-hard-fail", false, "accepted: nftproxy always exits when it cannot bind its health or metrics server")
	fs.StringVar(&k.showHiddenMetrics, "show-hidden-metrics-for-version", "", "accepted with a warning: nftproxy hides no metrics")
	fs.DurationVar(&k.iptablesSyncPeriod, "iptables-sync-period", 30*time.Second, "kube-proxy's name of --sync-period, used unless --proxy-mode is ipvs, as kube-proxy does")
	fs.DurationVar(&k.iptablesMinSyncPeriod, "iptables-min-sync-period", time.Second, "kube-proxy's name of --min-sync-period, used unless --proxy-mode is ipvs, as kube-proxy does")
	fs.DurationVar(&k.ipvsSyncPeriod, "ipvs-sync-period", 30*time.Second, "kube-proxy's --sync-period for --proxy-mode ipvs")
	fs.DurationVar(&k.ipvsMinSyncPeriod, "ipvs-min-sync-period", time.Second, "kube-proxy's --min-sync-period for --proxy-mode ipvs")
	fs.BoolVar(&k.iptablesLocalhostNodePorts, "iptables-localhost-nodeports", true, "with --proxy-mode iptables: serve NodePorts on 127.0.0.1 when --nodeport-addresses allow it, as kube-proxy's iptables mode; ignored otherwise, as in kube-proxy")
	k.noEffect = map[string]*string{}
	for _, name := range []string{"ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp", "ipvs-tcp-timeout",
		"ipvs-tcpfin-timeout", "ipvs-udp-timeout", "vmodule",
		// Gone from kube-proxy v1.36 (userspace mode's); old DaemonSets still pass it.
		"proxy-port-range",
		// cadvisor's, which kube-proxy's binary carries in its global flag set.
		"boot-id-file", "machine-id-file"} {
		k.noEffect[name] = fs.String(name, "", "kube-proxy's --"+name+": accepted with a warning, it has no effect in nftproxy")
	}
}

// applyKubeProxyFlags gives kube-proxy's flags their meaning. With --config
// kube-proxy ignores them (applyConfigFile has warned and reset them), but
// for the bind addresses' ports; --cleanup and --master still apply.
func (o *options) applyKubeProxyFlags(fs *flag.FlagSet) error {
	k := &o.kp
	if o.configFile == "" {
		if err := o.applyProxyMode(fs); err != nil {
			return err
		}
		for _, p := range []struct {
			name     string
			port     int
			addr     *string
			addrFlag string
		}{{"healthz-port", k.healthzPort, &o.healthzBindAddress, "healthz-bind-address"},
			{"metrics-port", k.metricsPort, &o.metricsBindAddress, "metrics-bind-address"}} {
			if !set(fs, p.name) {
				continue
			}
			switch {
			case p.port == 0:
				*p.addr = ""
			case hasPort(*p.addr):
				o.warn("--%s=%d has no effect: --%s %s has a port, and kube-proxy v1.36 then ignores it too", p.name, p.port, p.addrFlag, *p.addr)
			}
		}
		if set(fs, "feature-gates") {
			o.warn("--feature-gates=%s has no effect: nftproxy has no feature gates", k.featureGates)
		}
		if set(fs, "bind-address-hard-fail") && !k.bindAddressHardFail {
			o.warn("--bind-address-hard-fail=false: nftproxy exits when it cannot bind its health or metrics server anyway")
		}
		if set(fs, "show-hidden-metrics-for-version") {
			o.warn("--show-hidden-metrics-for-version has no effect: nftproxy hides no metrics")
		}
		for name := range k.noEffect {
			if set(fs, name) {
				o.warn("--%s has no effect in nftproxy (kube-proxy's IPVS mode, klog or cadvisor)", name)
			}
		}
	}
	// kube-proxy appends the port to an address given without one.
	o.healthzBindAddress = appendPortIfNeeded(o.healthzBindAddress, k.healthzPort)
	o.metricsBindAddress = appendPortIfNeeded(o.metricsBindAddress, k.metricsPort)
	return nil
}

// applyProxyMode maps --proxy-mode and the flags whose meaning depends on
// it, as kube-proxy v1.36 does.
func (o *options) applyProxyMode(fs *flag.FlagSet) error {
	k := &o.kp
	switch k.proxyMode {
	case "", "nftables":
	case "iptables", "ipvs":
		o.warn("--proxy-mode=%s: nftproxy programs nftables; that mode's defaults and flags are used (NodePorts on every address%s)",
			k.proxyMode, map[bool]string{true: ", and on 127.0.0.1 per --iptables-localhost-nodeports", false: ""}[k.proxyMode == "iptables"])
	default:
		return fmt.Errorf("--proxy-mode %q: nftproxy programs nftables, as kube-proxy's nftables mode; iptables and ipvs are accepted with a warning", k.proxyMode)
	}
	o.proxyMode = k.proxyMode
	ipvs := k.proxyMode == "ipvs"
	for _, p := range []struct {
		name, own string
		v         time.Duration
		dst       *time.Duration
		applies   bool
	}{
		{"iptables-sync-period", "sync-period", k.iptablesSyncPeriod, &o.syncPeriod, !ipvs},
		{"iptables-min-sync-period", "min-sync-period", k.iptablesMinSyncPeriod, &o.minSyncPeriod, !ipvs},
		{"ipvs-sync-period", "sync-period", k.ipvsSyncPeriod, &o.syncPeriod, ipvs},
		{"ipvs-min-sync-period", "min-sync-period", k.ipvsMinSyncPeriod, &o.minSyncPeriod, ipvs},
	} {
		switch {
		case !set(fs, p.name):
		case !p.applies:
			o.warn("--%s has no effect with --proxy-mode=%s, as in kube-proxy", p.name, modeName(k.proxyMode))
		case set(fs, p.own):
			o.warn("--%s has no effect beside --%s", p.name, p.own)
		default:
			*p.dst = p.v
		}
	}
	if k.proxyMode == "" || k.proxyMode == "nftables" {
		if set(fs, "iptables-localhost-nodeports") {
			o.warn("--iptables-localhost-nodeports has no effect in nftables mode, as in kube-proxy: use --localhost-nodeports")
		}
		return nil
	}
	if !set(fs, "nodeport-addresses") {
		o.nodePortAddresses = "" // every local address, that mode's default
	}
	if k.proxyMode == "iptables" && !set(fs, "localhost-nodeports") {
		o.localhostNodePorts = k.iptablesLocalhostNodePorts && localhostInNodePorts(splitList(o.nodePortAddresses))
	}
	return nil
}

func hasPort(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

// appendPortIfNeeded adds port to an address given as a bare IP, as
// kube-proxy does with its bind addresses; anything else is left as is.
func appendPortIfNeeded(addr string, port int) string {
	if addr == "" || hasPort(addr) {
		return addr
	}
	if _, err := netip.ParseAddr(addr); err != nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(port))
}
