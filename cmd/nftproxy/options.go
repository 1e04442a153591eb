package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// options are the command-line flags, named as kube-proxy names them where
// kube-proxy has the same setting.
type options struct {
	log                logOptions
	manifests          string
	kubeconfig         string
	configFile         string
	hostnameOverride   string
	nodeIPs            string
	clusterCIDRs       string
	nodePortAddresses  string
	bindAddress        string
	masqueradeAll      bool
	serviceCIDRs       string
	localhostNodePorts bool
	minSyncPeriod      time.Duration
	syncPeriod         time.Duration
	healthzBindAddress string
	metricsBindAddress string
	conntrack          bool
	profiling          bool
	verbosity          int
	cleanupKubeProxy   bool // run: replace kube-proxy's rules; cleanup: remove only kube-proxy's

	masqueradeBit       int
	detectLocalMode     string
	bridgeInterface     string
	interfaceNamePrefix string
	ct                  conntrackTuning
	oomScoreAdj         int
	configSyncPeriod    time.Duration
	kubeAPIQPS          float64
	kubeAPIBurst        int
	kubeAPIContentType  string
	writeConfigTo       string
	initOnly            bool
	kp                  kubeProxyFlags
	// proxyMode is kube-proxy's mode the configuration was written for
	// (--proxy-mode or the config file's; empty: nftables); iptables and
	// ipvs keep their NodePort default, every local address.
	proxyMode string

	// warnings found while reading the configuration, logged once the
	// logger exists.
	warnings []string

	// explain
	src, dst, proto string
	port            uint
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.manifests, "manifests", "", "directory of Service, EndpointSlice and Node manifests to serve instead of an API server")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster config)")
	fs.StringVar(&o.configFile, "config", "", "a KubeProxyConfiguration file; the settings that apply to nftproxy are used, flags win")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "", "name of this node (default: the hostname)")
	fs.StringVar(&o.nodeIPs, "node-ip", "", "this node's addresses, one per family, comma-separated, when there is no Node object")
	fs.StringVar(&o.clusterCIDRs, "cluster-cidr", "", "pod CIDRs, one per family, comma-separated: ClusterIP traffic from outside is masqueraded")
	fs.StringVar(&o.nodePortAddresses, "nodeport-addresses", "primary", "CIDRs of the local addresses NodePorts answer on, comma-separated (a family without any: every local address), or 'primary': the node's primary address of each family, as kube-proxy's nftables mode")
	fs.StringVar(&o.bindAddress, "bind-address", "0.0.0.0", "the node's primary address of its family when not 0.0.0.0 or ::, as kube-proxy's --bind-address")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "masquerade all traffic to service addresses")
	fs.StringVar(&o.serviceCIDRs, "service-cidr", "", "ranges ClusterIPs come from, comma-separated: traffic to an unallocated address in them is dropped")
	fs.BoolVar(&o.localhostNodePorts, "localhost-nodeports", false, "serve IPv4 NodePorts on 127.0.0.1 too (sets route_localnet), as kube-proxy's iptables mode does")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", time.Second, "least time between two syncs; changes in between are coalesced")
	fs.DurationVar(&o.syncPeriod, "sync-period", 30*time.Second, "time between full resyncs that repair drift")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty to disable")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics; empty to disable")
	fs.BoolVar(&o.profiling, "profiling", false, "serve Go's profiles on /debug/pprof/ beside /metrics, as kube-proxy does")
	fs.BoolVar(&o.conntrack, "conntrack", true, "delete stale UDP and SCTP conntrack entries after each sync")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity: 2 logs each sync's batch, 4 the whole ruleset")
	fs.IntVar(&o.masqueradeBit, "iptables-masquerade-bit", 14, "the bit of the packet mark that asks for masquerade, 0-31, as kube-proxy's")
	fs.StringVar(&o.detectLocalMode, "detect-local-mode", proxier.LocalClusterCIDR, "how pod traffic is told apart (not masqueraded to ClusterIPs): ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix or None")
	fs.StringVar(&o.bridgeInterface, "pod-bridge-interface", "", "the pod bridge, for --detect-local-mode BridgeInterface")
	fs.StringVar(&o.interfaceNamePrefix, "pod-interface-name-prefix", "", "the pods' interface name prefix, for --detect-local-mode InterfaceNamePrefix")
	fs.IntVar(&o.ct.maxPerCore, "conntrack-max-per-core", 32768, "nf_conntrack_max per CPU set at start-up (0: leave it)")
	fs.IntVar(&o.ct.min, "conntrack-min", 131072, "least nf_conntrack_max set at start-up")
	fs.DurationVar(&o.ct.tcpEstablished, "conntrack-tcp-timeout-established", 24*time.Hour, "nf_conntrack_tcp_timeout_established set at start-up (0: leave it)")
	fs.DurationVar(&o.ct.tcpCloseWait, "conntrack-tcp-timeout-close-wait", time.Hour, "nf_conntrack_tcp_timeout_close_wait set at start-up (0: leave it)")
	fs.BoolVar(&o.ct.tcpBeLiberal, "conntrack-tcp-be-liberal", false, "set nf_conntrack_tcp_be_liberal; packets conntrack calls invalid are then not dropped")
	fs.DurationVar(&o.ct.udpTimeout, "conntrack-udp-timeout", 0, "nf_conntrack_udp_timeout set at start-up (0: leave it)")
	fs.DurationVar(&o.ct.udpStream, "conntrack-udp-timeout-stream", 0, "nf_conntrack_udp_timeout_stream set at start-up (0: leave it)")
	fs.IntVar(&o.oomScoreAdj, "oom-score-adj", -999, "the process's oom_score_adj, -1000 to 1000, as kube-proxy's")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", 15*time.Minute, "resync period of the API server informers")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 5, "queries per second to the API server")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 10, "burst of queries to the API server")
	fs.StringVar(&o.kubeAPIContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of requests to the API server")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "write the effective configuration as a KubeProxyConfiguration to this file and exit")
	fs.BoolVar(&o.initOnly, "init-only", false, "set up the node (sysctls, conntrack tuning) and exit, as kube-proxy's init container does")
	o.kp.register(fs)
	o.log.register(fs)
}

// conntrackTuning is kube-proxy's conntrack section.
type conntrackTuning struct {
	maxPerCore, min       int
	tcpEstablished        time.Duration
	tcpCloseWait          time.Duration
	tcpBeLiberal          bool
	udpTimeout, udpStream time.Duration
}

// flagsBesideConfig are the flags a config file does not override, as
// kube-proxy v1.36 keeps logging and --hostname-override; the others are
// nftproxy's own, which no KubeProxyConfiguration field holds.
var flagsBesideConfig = map[string]bool{"v": true, "hostname-override": true, "config": true,
	"write-config-to": true, "init-only": true, "manifests": true, "node-ip": true, "service-cidr": true,
	"conntrack": true, "localhost-nodeports": true, "cleanup-kube-proxy": true, "cleanup": true, "master": true, "src": true, "dst": true, "proto": true, "port": true}

func init() {
	for _, f := range logFlags {
		flagsBesideConfig[f] = true
	}
}

// kubeProxyConfiguration is KubeProxyConfiguration v1alpha1 as kube-proxy
// v1.36 has it: every field is known, so strict decoding finds the unknown
// ones. The fields nftproxy has no use for are decoded to be warned about.
type kubeProxyConfiguration struct {
	APIVersion       string          `json:"apiVersion"`
	Kind             string          `json:"kind"`
	FeatureGates     map[string]bool `json:"featureGates,omitempty"`
	ClientConnection struct {
		Kubeconfig         string   `json:"kubeconfig"`
		AcceptContentTypes string   `json:"acceptContentTypes"`
		ContentType        string   `json:"contentType"`
		QPS                *float64 `json:"qps"`
		Burst              *int     `json:"burst"`
	} `json:"clientConnection"`
	Logging                     map[string]any `json:"logging,omitempty"`
	HostnameOverride            string         `json:"hostnameOverride"`
	BindAddress                 string         `json:"bindAddress"`
	HealthzBindAddress          string         `json:"healthzBindAddress"`
	MetricsBindAddress          string         `json:"metricsBindAddress"`
	BindAddressHardFail         bool           `json:"bindAddressHardFail"`
	EnableProfiling             bool           `json:"enableProfiling"`
	ShowHiddenMetricsForVersion string         `json:"showHiddenMetricsForVersion"`
	Mode                        string         `json:"mode"`
	IPTables                    struct {
		MasqueradeBit      *int    `json:"masqueradeBit"`
		MasqueradeAll      bool    `json:"masqueradeAll"`
		LocalhostNodePorts *bool   `json:"localhostNodePorts"`
		SyncPeriod         *string `json:"syncPeriod"`
		MinSyncPeriod      *string `json:"minSyncPeriod"`
	} `json:"iptables"`
	IPVS     map[string]any `json:"ipvs"`
	NFTables struct {
		MasqueradeBit *int    `json:"masqueradeBit"`
		MasqueradeAll bool    `json:"masqueradeAll"`
		SyncPeriod    *string `json:"syncPeriod"`
		MinSyncPeriod *string `json:"minSyncPeriod"`
	} `json:"nftables"`
	Winkernel       map[string]any `json:"winkernel"`
	DetectLocalMode string         `json:"detectLocalMode"`
	DetectLocal     struct {
		BridgeInterface     string `json:"bridgeInterface"`
		InterfaceNamePrefix string `json:"interfaceNamePrefix"`
	} `json:"detectLocal"`
	ClusterCIDR       string   `json:"clusterCIDR"`
	NodePortAddresses []string `json:"nodePortAddresses"`
	OOMScoreAdj       *int     `json:"oomScoreAdj"`
	Conntrack         struct {
		MaxPerCore            *int    `json:"maxPerCore"`
		Min                   *int    `json:"min"`
		TCPEstablishedTimeout *string `json:"tcpEstablishedTimeout"`
		TCPCloseWaitTimeout   *string `json:"tcpCloseWaitTimeout"`
		TCPBeLiberal          bool    `json:"tcpBeLiberal"`
		UDPTimeout            *string `json:"udpTimeout"`
		UDPStreamTimeout      *string `json:"udpStreamTimeout"`
	} `json:"conntrack"`
	ConfigSyncPeriod    *string `json:"configSyncPeriod"`
	PortRange           string  `json:"portRange"`
	WindowsRunAsService bool    `json:"windowsRunAsService,omitempty"`
	// nftproxy's own: --cleanup-kube-proxy.
	CleanupKubeProxy *bool `json:"cleanupKubeProxy"`
}

// applyConfigFile replaces the options with the KubeProxyConfiguration file's,
// as kube-proxy v1.36 does: with --config, the flags that a field holds are
// ignored (each one set is warned about), except logging and
// --hostname-override. Unset fields take kube-proxy's defaults. Unknown
// fields are warned about as kube-proxy does, and the rest is used.
func (o *options) applyConfigFile(fs *flag.FlagSet) error {
	if o.configFile == "" {
		return nil
	}
	c, err := o.readConfigFile()
	if err != nil {
		return err
	}
	d := o.configDefaults(fs)
	d.applyNodeAndLogging(c, fs)
	d.applyClientConnection(c)
	d.applyServing(c, fs)
	d.applyDetectLocal(c)
	periods, err := d.applyModeSection(c, fs)
	if err != nil {
		return err
	}
	d.applyConntrack(c)
	if err := d.applyDurations(c, periods); err != nil {
		return err
	}
	d.warnUnusedFields(c)
	*o = *d
	return nil
}

// readConfigFile decodes the file strictly, else leniently with kube-proxy's
// warning, so that unknown fields do not stop the rest from being used.
func (o *options) readConfigFile() (*kubeProxyConfiguration, error) {
	data, err := os.ReadFile(o.configFile)
	if err != nil {
		return nil, fmt.Errorf("read config file: %w", err)
	}
	var c kubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		if err := yaml.Unmarshal(data, &c); err != nil {
			return nil, fmt.Errorf("parse config file %s: %w", o.configFile, err)
		}
		o.warn("Using lenient decoding as strict decoding failed: strict decoding error: %s", strictReason(err))
	}
	if c.Kind != "" && c.Kind != "KubeProxyConfiguration" {
		return nil, fmt.Errorf("parse config file %s: kind %q is not KubeProxyConfiguration", o.configFile, c.Kind)
	}
	return &c, nil
}

// configDefaults starts over from the defaults, keeping what a config file
// leaves to flags: the others given are warned about, as kube-proxy ignores
// them.
func (o *options) configDefaults(fs *flag.FlagSet) *options {
	d := new(options)
	dfs := flag.NewFlagSet("defaults", flag.ContinueOnError)
	d.register(dfs)
	fs.Visit(func(f *flag.Flag) {
		if flagsBesideConfig[f.Name] {
			_ = dfs.Set(f.Name, f.Value.String())
		} else {
			o.warn("Ignoring --%s: a config file is given, and kube-proxy ignores such flags then", f.Name)
		}
	})
	d.warnings = o.warnings
	d.configFile = o.configFile
	// The subcommands' own flags are not in register's set, so dfs cannot
	// take them: carry their values over as they are.
	d.cleanupKubeProxy = o.cleanupKubeProxy
	d.src, d.dst, d.proto, d.port = o.src, o.dst, o.proto, o.port
	return d
}

// setString and setPtr take a field the file gives: an unset one keeps
// kube-proxy's default.
func setString(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

func setPtr[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// applyNodeAndLogging: --hostname-override and the logging flags win over
// the file, as kube-proxy lays them over its fields.
func (o *options) applyNodeAndLogging(c *kubeProxyConfiguration, fs *flag.FlagSet) {
	if o.hostnameOverride == "" {
		o.hostnameOverride = c.HostnameOverride
	}
	o.hostnameOverride = strings.ToLower(strings.TrimSpace(o.hostnameOverride))
	if format, ok := c.Logging["format"].(string); ok && format != "" && !set(fs, "logging-format") {
		o.log.format = format
	}
}

// applyClientConnection: the clientConnection section.
func (o *options) applyClientConnection(c *kubeProxyConfiguration) {
	o.kubeconfig = c.ClientConnection.Kubeconfig
	setString(&o.kubeAPIContentType, c.ClientConnection.ContentType)
	setPtr(&o.kubeAPIQPS, c.ClientConnection.QPS)
	setPtr(&o.kubeAPIBurst, c.ClientConnection.Burst)
}

// applyServing: the top-level fields of addresses, profiling and the
// process; --cleanup-kube-proxy, nftproxy's own, wins over the file.
func (o *options) applyServing(c *kubeProxyConfiguration, fs *flag.FlagSet) {
	setString(&o.bindAddress, c.BindAddress)
	setString(&o.healthzBindAddress, c.HealthzBindAddress)
	setString(&o.metricsBindAddress, c.MetricsBindAddress)
	setString(&o.clusterCIDRs, c.ClusterCIDR)
	o.profiling = c.EnableProfiling
	setPtr(&o.oomScoreAdj, c.OOMScoreAdj)
	if !set(fs, "cleanup-kube-proxy") {
		setPtr(&o.cleanupKubeProxy, c.CleanupKubeProxy)
	}
}

// applyDetectLocal: detectLocalMode and its detectLocal section.
func (o *options) applyDetectLocal(c *kubeProxyConfiguration) {
	setString(&o.detectLocalMode, c.DetectLocalMode)
	setString(&o.bridgeInterface, c.DetectLocal.BridgeInterface)
	setString(&o.interfaceNamePrefix, c.DetectLocal.InterfaceNamePrefix)
}

// syncPeriods are the mode section's sync periods, unparsed.
type syncPeriods struct{ sync, minSync *string }

// applyModeSection applies the mode's own section: nftables, else (iptables,
// ipvs and kube-proxy's default, iptables) the iptables one, whose
// nodePortAddresses default is every address and whose localhostNodePorts
// defaults to on.
func (o *options) applyModeSection(c *kubeProxyConfiguration, fs *flag.FlagSet) (syncPeriods, error) {
	var masqBit *int
	var p syncPeriods
	o.proxyMode = c.Mode
	if c.Mode == "" {
		o.proxyMode = "iptables"
	}
	switch c.Mode {
	case "nftables":
		o.masqueradeAll, masqBit = c.NFTables.MasqueradeAll, c.NFTables.MasqueradeBit
		p = syncPeriods{c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod}
		o.nodePortAddresses = "primary"
	case "", "iptables", "ipvs":
		o.masqueradeAll, masqBit = c.IPTables.MasqueradeAll, c.IPTables.MasqueradeBit
		p = syncPeriods{c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod}
		o.nodePortAddresses = ""
		if !set(fs, "localhost-nodeports") && (c.IPTables.LocalhostNodePorts == nil || *c.IPTables.LocalhostNodePorts) {
			o.localhostNodePorts = localhostInNodePorts(c.NodePortAddresses)
		}
		o.warn("Config file mode %q: nftproxy programs nftables; the iptables section's settings are used", modeName(c.Mode))
	default:
		return p, fmt.Errorf("parse config file %s: mode %q: nftproxy supports nftables, and iptables or ipvs configurations through their iptables section", o.configFile, c.Mode)
	}
	if len(c.NodePortAddresses) > 0 {
		o.nodePortAddresses = strings.Join(c.NodePortAddresses, ",")
	}
	setPtr(&o.masqueradeBit, masqBit)
	return p, nil
}

// applyConntrack: the conntrack section's numbers; its timeouts are
// durations (applyDurations).
func (o *options) applyConntrack(c *kubeProxyConfiguration) {
	setPtr(&o.ct.maxPerCore, c.Conntrack.MaxPerCore)
	setPtr(&o.ct.min, c.Conntrack.Min)
	o.ct.tcpBeLiberal = c.Conntrack.TCPBeLiberal
}

// applyDurations parses the file's durations, naming the field of a bad one.
func (o *options) applyDurations(c *kubeProxyConfiguration, p syncPeriods) error {
	for _, dur := range []struct {
		field string
		v     *string
		dst   *time.Duration
	}{
		{"nftables/iptables.syncPeriod", p.sync, &o.syncPeriod},
		{"nftables/iptables.minSyncPeriod", p.minSync, &o.minSyncPeriod},
		{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout, &o.ct.tcpEstablished},
		{"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout, &o.ct.tcpCloseWait},
		{"conntrack.udpTimeout", c.Conntrack.UDPTimeout, &o.ct.udpTimeout},
		{"conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout, &o.ct.udpStream},
		{"configSyncPeriod", c.ConfigSyncPeriod, &o.configSyncPeriod},
	} {
		if dur.v == nil || *dur.v == "" {
			continue
		}
		v, err := time.ParseDuration(*dur.v)
		if err != nil {
			return fmt.Errorf("parse config file %s: %s: %w", o.configFile, dur.field, err)
		}
		*dur.dst = v
	}
	return nil
}

// warnUnusedFields names the fields given that nftproxy has no use for, so
// that an operator does not expect them to act.
func (o *options) warnUnusedFields(c *kubeProxyConfiguration) {
	if len(c.IPVS) > 0 {
		o.warn("Config file field ipvs (%s) is for kube-proxy's ipvs mode: nftproxy has no use for it", strings.Join(slices.Sorted(maps.Keys(c.IPVS)), ", "))
	}
	if len(c.Winkernel) > 0 {
		o.warn("Config file field winkernel (%s) is for Windows: nftproxy has no use for it", strings.Join(slices.Sorted(maps.Keys(c.Winkernel)), ", "))
	}
	for name, v := range map[string]bool{"portRange": c.PortRange != "", "bindAddressHardFail": c.BindAddressHardFail,
		"windowsRunAsService": c.WindowsRunAsService, "showHiddenMetricsForVersion": c.ShowHiddenMetricsForVersion != "",
		"featureGates": len(c.FeatureGates) > 0, "clientConnection.acceptContentTypes": c.ClientConnection.AcceptContentTypes != ""} {
		if v {
			o.warn("Config file field %s has no effect in nftproxy (kube-proxy v1.36 ignores it on Linux too, or it concerns features nftproxy does not gate)", name)
		}
	}
}

func modeName(m string) string {
	if m == "" {
		return "iptables (kube-proxy's default)"
	}
	return m
}

func set(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// localhostInNodePorts tells whether kube-proxy's iptables mode would serve
// NodePorts on 127.0.0.1 for these nodePortAddresses: when they have no IPv4
// CIDR (every address) or one holding 127.0.0.1.
func localhostInNodePorts(cidrs []string) bool {
	v4 := false
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		v4 = true
		if p.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return !v4
}

// strictReason turns sigs.k8s.io/yaml's strict error into kube-proxy's words:
// unknown field "x".
func strictReason(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "unknown field"); i >= 0 {
		return msg[i:]
	}
	return msg
}

func (o *options) warn(format string, args ...any) {
	o.warnings = append(o.warnings, fmt.Sprintf(format, args...))
}

// compileConfigs turns the options into one compile configuration per family.
func (o *options) compileConfigs() ([]proxier.Config, error) {
	clusterCIDRs, err := parsePrefixes("--cluster-cidr", o.clusterCIDRs)
	if err != nil {
		return nil, err
	}
	if err := onePerFamily("--cluster-cidr", clusterCIDRs); err != nil {
		return nil, err
	}
	var npAddrs []netip.Prefix
	// Empty means primary in nftables mode, every address in the others, as
	// kube-proxy has it.
	primary := o.nodePortAddresses == "primary" || (o.nodePortAddresses == "" && o.proxyMode != "iptables" && o.proxyMode != "ipvs")
	if !primary {
		if npAddrs, err = parsePrefixes("--nodeport-addresses", o.nodePortAddresses); err != nil {
			return nil, err
		}
	}
	var bind netip.Addr
	if o.bindAddress != "" {
		if bind, err = netip.ParseAddr(o.bindAddress); err != nil {
			return nil, fmt.Errorf("parse --bind-address: %w", err)
		}
	}
	serviceCIDRs, err := parsePrefixes("--service-cidr", o.serviceCIDRs)
	if err != nil {
		return nil, err
	}
	if o.masqueradeBit < 0 || o.masqueradeBit > 31 {
		return nil, fmt.Errorf("masqueradeBit %d is not in 0-31", o.masqueradeBit)
	}
	detect := proxier.DetectLocal{Mode: o.detectLocalMode}
	switch o.detectLocalMode {
	case "", proxier.LocalClusterCIDR, proxier.LocalNodeCIDR, proxier.LocalNone:
	case proxier.LocalBridgeInterface:
		detect.Interface = o.bridgeInterface
	case proxier.LocalInterfaceNamePrefix:
		detect.Interface = o.interfaceNamePrefix
	default:
		return nil, fmt.Errorf("detect-local-mode %q: want ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix or None", o.detectLocalMode)
	}
	if (detect.Mode == proxier.LocalBridgeInterface || detect.Mode == proxier.LocalInterfaceNamePrefix) &&
		(detect.Interface == "" || len(detect.Interface) >= 15 || strings.ContainsAny(detect.Interface, "*\\\" /")) {
		return nil, fmt.Errorf("detect-local-mode %s needs a valid interface name (--pod-bridge-interface, --pod-interface-name-prefix), not %q", detect.Mode, detect.Interface)
	}
	var out []proxier.Config
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		out = append(out, proxier.Config{Family: f, ClusterCIDRs: clusterCIDRs, MasqueradeAll: o.masqueradeAll,
			NodePortAddresses: npAddrs, NodePortPrimary: primary, BindAddress: bind,
			ServiceCIDRs: serviceCIDRs, LocalhostNodePorts: o.localhostNodePorts,
			MasqueradeBit: o.masqueradeBit, DetectLocal: detect, DropInvalid: !o.ct.tcpBeLiberal})
	}
	return out, nil
}

func (o *options) parseNodeIPs() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range splitList(o.nodeIPs) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("parse --node-ip: %w", err)
		}
		out = append(out, a)
	}
	return out, nil
}

func parsePrefixes(flagName, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range splitList(s) {
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", flagName, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func onePerFamily(flagName string, ps []netip.Prefix) error {
	var v4, v6 int
	for _, p := range ps {
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		return errors.New(flagName + " takes at most one CIDR per family")
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// writeConfig writes the effective configuration as a KubeProxyConfiguration
// (mode nftables) to --write-config-to, as kube-proxy's flag does, and
// returns: the file can be given back with --config.
func writeConfig(o *options, log *zap.Logger) error {
	c := effectiveConfig(o)
	data, err := yaml.Marshal(&c)
	if err != nil {
		return fmt.Errorf("encode configuration: %w", err)
	}
	if err := os.WriteFile(o.writeConfigTo, data, 0o644); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	log.Info("Wrote configuration", zap.String("file", o.writeConfigTo))
	return nil
}

// effectiveConfig is the configuration in use, as a KubeProxyConfiguration
// (mode nftables): what --write-config-to writes and /configz serves.
func effectiveConfig(o *options) kubeProxyConfiguration {
	dur := func(d time.Duration) *string { s := d.String(); return &s }
	var c kubeProxyConfiguration
	c.APIVersion, c.Kind, c.Mode = "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration", "nftables"
	c.ClientConnection.Kubeconfig = o.kubeconfig
	c.ClientConnection.ContentType = o.kubeAPIContentType
	c.ClientConnection.QPS, c.ClientConnection.Burst = &o.kubeAPIQPS, &o.kubeAPIBurst
	c.HostnameOverride, c.BindAddress = o.hostnameOverride, o.bindAddress
	c.HealthzBindAddress, c.MetricsBindAddress = o.healthzBindAddress, o.metricsBindAddress
	c.EnableProfiling = o.profiling
	c.NFTables.MasqueradeAll, c.NFTables.MasqueradeBit = o.masqueradeAll, &o.masqueradeBit
	c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod = dur(o.syncPeriod), dur(o.minSyncPeriod)
	c.DetectLocalMode = o.detectLocalMode
	c.DetectLocal.BridgeInterface, c.DetectLocal.InterfaceNamePrefix = o.bridgeInterface, o.interfaceNamePrefix
	c.ClusterCIDR = o.clusterCIDRs
	c.NodePortAddresses = splitList(o.nodePortAddresses)
	if len(c.NodePortAddresses) == 0 && (o.proxyMode == "iptables" || o.proxyMode == "ipvs") {
		// Every address, which empty means in those modes only: in
		// nftables mode (what this configuration says) it means primary.
		c.NodePortAddresses = []string{"0.0.0.0/0", "::/0"}
	}
	c.OOMScoreAdj = &o.oomScoreAdj
	c.Conntrack.MaxPerCore, c.Conntrack.Min = &o.ct.maxPerCore, &o.ct.min
	c.Conntrack.TCPEstablishedTimeout, c.Conntrack.TCPCloseWaitTimeout = dur(o.ct.tcpEstablished), dur(o.ct.tcpCloseWait)
	c.Conntrack.TCPBeLiberal = o.ct.tcpBeLiberal
	c.Conntrack.UDPTimeout, c.Conntrack.UDPStreamTimeout = dur(o.ct.udpTimeout), dur(o.ct.udpStream)
	c.ConfigSyncPeriod = dur(o.configSyncPeriod)
	c.CleanupKubeProxy = &o.cleanupKubeProxy
	return c
}
