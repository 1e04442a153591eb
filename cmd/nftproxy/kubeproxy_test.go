package main

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCleanupKubeProxyFromConfigOrFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("kind: KubeProxyConfiguration\ncleanupKubeProxy: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	silent := filepath.Join(t.TempDir(), "silent.yaml")
	if err := os.WriteFile(silent, []byte("kind: KubeProxyConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--config", file}, true},
		{[]string{"--config", file, "--cleanup-kube-proxy=false"}, false},
		{[]string{"--cleanup-kube-proxy"}, true},
		{nil, false},
		// A file that does not say keeps the flag's value.
		{[]string{"--config", silent, "--cleanup-kube-proxy"}, true},
		{[]string{"--config", silent}, false},
	} {
		var o options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.register(fs)
		fs.BoolVar(&o.cleanupKubeProxy, "cleanup-kube-proxy", false, "")
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		if err := o.applyConfigFile(fs); err != nil {
			t.Fatal(err)
		}
		if o.cleanupKubeProxy != tt.want {
			t.Errorf("%q: cleanupKubeProxy %v, want %v", tt.args, o.cleanupKubeProxy, tt.want)
		}
	}
}

// parseFlags parses args as run does, up to the kube-proxy flags.
func parseFlags(t *testing.T, args ...string) (options, error) {
	t.Helper()
	var o options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if err := o.applyConfigFile(fs); err != nil {
		return o, err
	}
	return o, o.applyKubeProxyFlags(fs)
}

// TestKubeProxyFlags: kube-proxy v1.36's flags are accepted with its
// meaning, or warned about by name; an unusable mode is refused.
func TestKubeProxyFlags(t *testing.T) {
	type want struct {
		healthz, metrics   string
		syncPeriod         time.Duration
		minSyncPeriod      time.Duration
		nodePortAddresses  string
		localhostNodePorts bool
		primary            bool // the compiled configuration's NodePortPrimary
		warning            string
	}
	def := want{healthz: "0.0.0.0:10256", metrics: "127.0.0.1:10249", syncPeriod: 30 * time.Second, minSyncPeriod: time.Second,
		nodePortAddresses: "primary", primary: true}
	with := func(f func(*want)) want { w := def; f(&w); return w }
	tests := []struct {
		args []string
		want want
	}{
		{nil, def},
		{[]string{"--proxy-mode=nftables"}, def},
		{[]string{"--proxy-mode", "iptables"}, with(func(w *want) {
			w.nodePortAddresses, w.primary, w.localhostNodePorts, w.warning = "", false, true, "--proxy-mode=iptables"
		})},
		{[]string{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false"}, with(func(w *want) {
			w.nodePortAddresses, w.primary, w.warning = "", false, "--proxy-mode=iptables"
		})},
		{[]string{"--proxy-mode=iptables", "--nodeport-addresses=192.168.0.0/16"}, with(func(w *want) {
			w.nodePortAddresses, w.primary, w.warning = "192.168.0.0/16", false, "--proxy-mode=iptables"
		})},
		{[]string{"--proxy-mode=ipvs", "--ipvs-sync-period=1m", "--iptables-sync-period=2m"}, with(func(w *want) {
			w.nodePortAddresses, w.primary, w.syncPeriod, w.warning = "", false, time.Minute, "--iptables-sync-period has no effect with --proxy-mode=ipvs"
		})},
		{[]string{"--iptables-sync-period=2m", "--iptables-min-sync-period=5s"}, with(func(w *want) {
			w.syncPeriod, w.minSyncPeriod = 2*time.Minute, 5*time.Second
		})},
		{[]string{"--iptables-sync-period=2m", "--sync-period=1m"}, with(func(w *want) {
			w.syncPeriod, w.warning = time.Minute, "--iptables-sync-period has no effect beside --sync-period"
		})},
		{[]string{"--iptables-localhost-nodeports=true"}, with(func(w *want) { w.warning = "--iptables-localhost-nodeports has no effect in nftables mode" })},
		{[]string{"--healthz-port=0", "--metrics-port=0"}, with(func(w *want) { w.healthz, w.metrics = "", "" })},
		// As kube-proxy v1.36: the port only completes an address without one.
		{[]string{"--healthz-port=12345"}, with(func(w *want) { w.warning = "--healthz-port=12345 has no effect" })},
		{[]string{"--healthz-bind-address=10.0.0.1", "--healthz-port=12345", "--metrics-bind-address=::1"}, with(func(w *want) {
			w.healthz, w.metrics = "10.0.0.1:12345", "[::1]:10249"
		})},
		{[]string{"--feature-gates=Foo=true"}, with(func(w *want) { w.warning = "--feature-gates=Foo=true has no effect" })},
		{[]string{"--bind-address-hard-fail=false"}, with(func(w *want) { w.warning = "--bind-address-hard-fail=false" })},
		{[]string{"--bind-address-hard-fail"}, def},
		{[]string{"--show-hidden-metrics-for-version=1.35"}, with(func(w *want) { w.warning = "--show-hidden-metrics-for-version" })},
		{[]string{"--ipvs-scheduler=rr", "--ipvs-strict-arp=true"}, with(func(w *want) { w.warning = "--ipvs-s" })},
		{[]string{"--boot-id-file=/proc/sys/kernel/random/boot_id", "--machine-id-file=/etc/machine-id"}, with(func(w *want) { w.warning = "cadvisor" })},
		{[]string{"--logging-format=text", "--vmodule=x=2"}, with(func(w *want) { w.warning = "--vmodule" })},
		{[]string{"--proxy-port-range=30000-30100"}, with(func(w *want) { w.warning = "--proxy-port-range" })},
		{[]string{"--master=https://10.0.0.1:6443", "--cleanup"}, def},
	}
	for _, tt := range tests {
		o, err := parseFlags(t, tt.args...)
		if err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		cfgs, err := o.compileConfigs()
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		got := want{o.healthzBindAddress, o.metricsBindAddress, o.syncPeriod, o.minSyncPeriod, o.nodePortAddresses,
			o.localhostNodePorts, cfgs[0].NodePortPrimary, tt.want.warning}
		if got != tt.want {
			t.Errorf("%q: %+v, want %+v", tt.args, got, tt.want)
		}
		if tt.want.warning != "" && !hasWarning(o, tt.want.warning) {
			t.Errorf("%q: warnings %q, want one with %q", tt.args, o.warnings, tt.want.warning)
		}
		if tt.want.warning == "" && len(o.warnings) > 0 {
			t.Errorf("%q: warnings %q, want none", tt.args, o.warnings)
		}
	}
	// /configz and --write-config-to say mode nftables: every address must
	// be spelled out there, as empty means primary in that mode.
	o, _ := parseFlags(t, "--proxy-mode=iptables")
	if got := effectiveConfig(&o).NodePortAddresses; !slices.Equal(got, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("--proxy-mode=iptables: effective nodePortAddresses %q, want every address", got)
	}
	o, _ = parseFlags(t, "--master=https://10.0.0.1:6443", "--cleanup")
	if o.kp.master != "https://10.0.0.1:6443" || !o.kp.cleanup {
		t.Errorf("--master, --cleanup: %q, %v", o.kp.master, o.kp.cleanup)
	}
	for _, mode := range []string{"kernelspace", "userspace", "NFTABLES"} {
		if _, err := parseFlags(t, "--proxy-mode="+mode); err == nil || !strings.Contains(err.Error(), "--proxy-mode") {
			t.Errorf("--proxy-mode=%s: %v, want a refusal naming the flag", mode, err)
		}
	}
}

// TestKubeProxyFlagsBesideConfigFile: with --config, kube-proxy's flags are
// ignored with a warning as kube-proxy ignores them, but --cleanup and
// --master, which no field holds.
func TestKubeProxyFlagsBesideConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("kind: KubeProxyConfiguration\nmode: nftables\nhealthzBindAddress: 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags(t, "--config", file, "--proxy-mode=ipvs", "--healthz-port=0", "--cleanup", "--master=https://m")
	if err != nil {
		t.Fatal(err)
	}
	if !hasWarning(o, "Ignoring --proxy-mode") || !hasWarning(o, "Ignoring --healthz-port") {
		t.Errorf("warnings %q, want --proxy-mode and --healthz-port ignored", o.warnings)
	}
	// The field's bare address gets kube-proxy's default port.
	if o.healthzBindAddress != "10.0.0.1:10256" || o.proxyMode != "nftables" || !o.kp.cleanup || o.kp.master != "https://m" {
		t.Errorf("healthz %q, mode %q, cleanup %v, master %q", o.healthzBindAddress, o.proxyMode, o.kp.cleanup, o.kp.master)
	}
}
