package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// options are the command-line flags, named as kube-proxy names them where
// kube-proxy has the same setting.
type options struct {
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
}

// kubeProxyConfiguration holds the fields of a KubeProxyConfiguration that
// nftproxy honours.
type kubeProxyConfiguration struct {
	Kind               string   `json:"kind"`
	ClusterCIDR        string   `json:"clusterCIDR"`
	HostnameOverride   string   `json:"hostnameOverride"`
	HealthzBindAddress string   `json:"healthzBindAddress"`
	MetricsBindAddress string   `json:"metricsBindAddress"`
	EnableProfiling    *bool    `json:"enableProfiling"`
	NodePortAddresses  []string `json:"nodePortAddresses"`
	ClientConnection   struct {
		Kubeconfig string `json:"kubeconfig"`
	} `json:"clientConnection"`
	NFTables struct {
		MasqueradeAll *bool   `json:"masqueradeAll"`
		MinSyncPeriod *string `json:"minSyncPeriod"`
		SyncPeriod    *string `json:"syncPeriod"`
	} `json:"nftables"`
	// nftproxy's own: --cleanup-kube-proxy.
	CleanupKubeProxy *bool `json:"cleanupKubeProxy"`
}

// applyConfigFile fills the options the command line did not set from the
// KubeProxyConfiguration file.
func (o *options) applyConfigFile(fs *flag.FlagSet) error {
	if o.configFile == "" {
		return nil
	}
	data, err := os.ReadFile(o.configFile)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	var c kubeProxyConfiguration
	if err := yaml.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("parse config file %s: %w", o.configFile, err)
	}
	if c.Kind != "" && c.Kind != "KubeProxyConfiguration" {
		return fmt.Errorf("parse config file %s: kind %q is not KubeProxyConfiguration", o.configFile, c.Kind)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	setString := func(name string, dst *string, v string) {
		if !set[name] && v != "" {
			*dst = v
		}
	}
	setString("cluster-cidr", &o.clusterCIDRs, c.ClusterCIDR)
	setString("hostname-override", &o.hostnameOverride, c.HostnameOverride)
	setString("healthz-bind-address", &o.healthzBindAddress, c.HealthzBindAddress)
	setString("metrics-bind-address", &o.metricsBindAddress, c.MetricsBindAddress)
	setString("nodeport-addresses", &o.nodePortAddresses, strings.Join(c.NodePortAddresses, ","))
	setString("kubeconfig", &o.kubeconfig, c.ClientConnection.Kubeconfig)
	if c.EnableProfiling != nil && !set["profiling"] {
		o.profiling = *c.EnableProfiling
	}
	if c.CleanupKubeProxy != nil && !set["cleanup-kube-proxy"] {
		o.cleanupKubeProxy = *c.CleanupKubeProxy
	}
	if c.NFTables.MasqueradeAll != nil && !set["masquerade-all"] {
		o.masqueradeAll = *c.NFTables.MasqueradeAll
	}
	for name, v := range map[string]*string{"min-sync-period": c.NFTables.MinSyncPeriod, "sync-period": c.NFTables.SyncPeriod} {
		if v == nil || set[name] {
			continue
		}
		d, err := time.ParseDuration(*v)
		if err != nil {
			return fmt.Errorf("parse config file %s: %s: %w", o.configFile, name, err)
		}
		if name == "sync-period" {
			o.syncPeriod = d
		} else {
			o.minSyncPeriod = d
		}
	}
	return nil
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
	primary := o.nodePortAddresses == "" || o.nodePortAddresses == "primary"
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
	var out []proxier.Config
	for _, f := range []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6} {
		out = append(out, proxier.Config{Family: f, ClusterCIDRs: clusterCIDRs, MasqueradeAll: o.masqueradeAll,
			NodePortAddresses: npAddrs, NodePortPrimary: primary, BindAddress: bind,
			ServiceCIDRs: serviceCIDRs, LocalhostNodePorts: o.localhostNodePorts})
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
