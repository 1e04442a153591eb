package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestBadInvocationsFailWithAReason(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"dump", "--cluster-cidr", "10.0.0.0/33", "--manifests", "x"}, "--cluster-cidr"},
		{[]string{"dump", "--cluster-cidr", "10.0.0.0/8,10.1.0.0/16", "--manifests", "x"}, "one CIDR per family"},
		{[]string{"dump", "--node-ip", "banana", "--manifests", "../../deploy/examples"}, "--node-ip"},
		{[]string{"dump"}, "--manifests is required"},
		{[]string{"dump", "--manifests", "/does/not/exist"}, "/does/not/exist"},
		{[]string{"dump", "--config", "/does/not/exist"}, "read config file"},
		{[]string{"explain", "--manifests", "../../deploy/examples", "--dst", "10.96.0.10", "--port", "0"}, "--port"},
		{[]string{"run", "stray"}, "unexpected argument"},
		{[]string{"dump", "--proxy-mode", "kernelspace", "--manifests", "x"}, "--proxy-mode \"kernelspace\""},
	}
	for _, tt := range tests {
		err := run(tt.args)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("nftproxy %v: error %v, want one mentioning %q", tt.args, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("nftproxy %v: the reason should be one line: %q", tt.args, err)
		}
	}
}

// loadConfig parses args and applies the config file body, as run does.
func loadConfig(t *testing.T, body string, args ...string) options {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var o options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(append([]string{"--config", file}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := o.applyConfigFile(fs); err != nil {
		t.Fatal(err)
	}
	return o
}

func hasWarning(o options, part string) bool {
	return slices.ContainsFunc(o.warnings, func(w string) bool { return strings.Contains(w, part) })
}

// With --config, flags are ignored except logging and --hostname-override,
// as kube-proxy v1.36 does; each ignored flag is warned about.
func TestConfigFileWinsOverFlags(t *testing.T) {
	o := loadConfig(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16
metricsBindAddress: 127.0.0.1:9999
enableProfiling: true
hostnameOverride: Ignored-Too
nodePortAddresses: [192.168.0.0/16]
nftables:
  masqueradeAll: true
  masqueradeBit: 13
  syncPeriod: 1m
`, "--metrics-bind-address", "127.0.0.1:1", "--hostname-override", "Node-1", "-v", "2", "--masquerade-all=false")
	if o.clusterCIDRs != "10.244.0.0/16" || !o.masqueradeAll || o.syncPeriod != time.Minute || o.masqueradeBit != 13 ||
		o.nodePortAddresses != "192.168.0.0/16" || o.metricsBindAddress != "127.0.0.1:9999" || !o.profiling ||
		o.hostnameOverride != "node-1" || o.verbosity != 2 {
		t.Errorf("options after the config file: %+v", o)
	}
	for _, f := range []string{"--metrics-bind-address", "--masquerade-all"} {
		if !hasWarning(o, "Ignoring "+f) {
			t.Errorf("no warning about the ignored %s: %q", f, o.warnings)
		}
	}
}

func TestConfigFileFields(t *testing.T) {
	t.Run("UnknownFieldsAreWarnedAndTheRestUsed", func(t *testing.T) {
		o := loadConfig(t, "kind: KubeProxyConfiguration\nmode: nftables\nfrobnicate: 1\nclusterCIDR: 10.0.0.0/8\n")
		if !hasWarning(o, `strict decoding error: unknown field "frobnicate"`) || o.clusterCIDRs != "10.0.0.0/8" {
			t.Errorf("warnings %q, clusterCIDRs %q", o.warnings, o.clusterCIDRs)
		}
	})
	t.Run("IPTablesModeUsesItsSection", func(t *testing.T) {
		o := loadConfig(t, "kind: KubeProxyConfiguration\nmode: iptables\niptables:\n  masqueradeAll: true\n  masqueradeBit: 12\n  minSyncPeriod: 5s\n"+
			"nftables:\n  masqueradeAll: false\n")
		if !o.masqueradeAll || o.masqueradeBit != 12 || o.minSyncPeriod != 5*time.Second || o.nodePortAddresses != "" || !o.localhostNodePorts {
			t.Errorf("iptables-mode config: %+v", o)
		}
		if !hasWarning(o, `Config file mode "iptables"`) {
			t.Errorf("no warning that the iptables section stands in: %q", o.warnings)
		}
	})
	t.Run("IPTablesLocalhostNodePortsOnlyWithLoopback", func(t *testing.T) {
		o := loadConfig(t, "kind: KubeProxyConfiguration\nnodePortAddresses: [192.168.0.0/16]\n")
		if o.localhostNodePorts {
			t.Error("localhostNodePorts on although nodePortAddresses leave 127.0.0.1 out")
		}
	})
	t.Run("IrrelevantSectionsAreWarnedByName", func(t *testing.T) {
		o := loadConfig(t, "kind: KubeProxyConfiguration\nmode: nftables\nipvs:\n  scheduler: rr\nwinkernel:\n  networkName: x\nportRange: 1-2\n")
		for _, w := range []string{"ipvs (scheduler)", "winkernel (networkName)", "portRange"} {
			if !hasWarning(o, w) {
				t.Errorf("no warning naming %s: %q", w, o.warnings)
			}
		}
	})
	t.Run("EverythingElse", func(t *testing.T) {
		o := loadConfig(t, `kind: KubeProxyConfiguration
mode: nftables
bindAddress: 192.168.77.1
clientConnection: {kubeconfig: /k, qps: 50, burst: 100, contentType: application/json}
detectLocalMode: BridgeInterface
detectLocal: {bridgeInterface: cbr0}
oomScoreAdj: -500
configSyncPeriod: 1m
conntrack: {maxPerCore: 0, min: 5, tcpEstablishedTimeout: 2h, tcpCloseWaitTimeout: 30m, tcpBeLiberal: true, udpTimeout: 40s, udpStreamTimeout: 3m}
`)
		want := conntrackTuning{maxPerCore: 0, min: 5, tcpEstablished: 2 * time.Hour, tcpCloseWait: 30 * time.Minute, tcpBeLiberal: true,
			udpTimeout: 40 * time.Second, udpStream: 3 * time.Minute}
		if o.bindAddress != "192.168.77.1" || o.kubeconfig != "/k" || o.kubeAPIQPS != 50 || o.kubeAPIBurst != 100 ||
			o.kubeAPIContentType != "application/json" || o.detectLocalMode != "BridgeInterface" || o.bridgeInterface != "cbr0" ||
			o.oomScoreAdj != -500 || o.configSyncPeriod != time.Minute || o.ct != want {
			t.Errorf("options: %+v", o)
		}
		cfgs, err := o.compileConfigs()
		if err != nil {
			t.Fatal(err)
		}
		if cfgs[0].DropInvalid || cfgs[0].DetectLocal.Interface != "cbr0" || cfgs[0].BindAddress.String() != "192.168.77.1" {
			t.Errorf("compile config: %+v", cfgs[0])
		}
	})
	t.Run("WriteConfigToReadsBack", func(t *testing.T) {
		var o options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.register(fs)
		if err := fs.Parse([]string{"--cluster-cidr", "10.244.0.0/16", "--iptables-masquerade-bit", "13", "--detect-local-mode", "NodeCIDR"}); err != nil {
			t.Fatal(err)
		}
		o.writeConfigTo = filepath.Join(t.TempDir(), "out.yaml")
		if err := writeConfig(&o, zap.NewNop()); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(o.writeConfigTo)
		if err != nil {
			t.Fatal(err)
		}
		back := loadConfig(t, string(data))
		if len(back.warnings) > 0 || back.clusterCIDRs != o.clusterCIDRs || back.masqueradeBit != 13 || back.detectLocalMode != "NodeCIDR" || back.ct != o.ct {
			t.Errorf("read back %+v (warnings %q) from:\n%s", back, back.warnings, data)
		}
	})
}

func TestConntrackSysctls(t *testing.T) {
	got := conntrackSysctls(conntrackTuning{maxPerCore: 32768, min: 131072, tcpEstablished: 24 * time.Hour, tcpCloseWait: time.Hour}, 2)
	want := []sysctl{
		{name: "net/netfilter/nf_conntrack_max", value: 131072, raiseOnly: true},
		{name: "net/netfilter/nf_conntrack_tcp_timeout_established", value: 86400},
		{name: "net/netfilter/nf_conntrack_tcp_timeout_close_wait", value: 3600},
	}
	if !slices.Equal(got, want) {
		t.Errorf("conntrackSysctls = %+v, want %+v", got, want)
	}
	if got := conntrackSysctls(conntrackTuning{tcpBeLiberal: true, udpTimeout: time.Minute}, 8); len(got) != 2 ||
		got[1].name != "net/netfilter/nf_conntrack_tcp_be_liberal" {
		t.Errorf("be liberal, udp: %+v", got)
	}
}

func TestDumpAndExplainExamples(t *testing.T) {
	o := options{manifests: "../../deploy/examples", hostnameOverride: "node-1", clusterCIDRs: "10.244.0.0/16"}
	var out bytes.Buffer
	if err := dump(&out, &o, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"table ip nftproxy {", "table ip6 nftproxy {", `comment "default/web:http"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dump lacks %q", want)
		}
	}
	out.Reset()
	o.src, o.dst, o.proto, o.port = "192.168.77.2", "10.96.0.10", "tcp", 80
	if err := explain(&out, &o, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"verdict: accept", "endpoint: 10.244.1.10:8080", "endpoint: 10.244.1.12:8080", "masquerade: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, out.String())
		}
	}
}

func TestProxyModeAndConfigz(t *testing.T) {
	o := loadConfig(t, "kind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16\nnftables:\n  masqueradeBit: 13\n")
	mux := http.NewServeMux()
	addStatusHandlers(mux, &o)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get("/proxyMode"); got != "nftables" {
		t.Errorf("/proxyMode = %q", got)
	}
	var configz map[string]struct {
		Mode        string `json:"mode"`
		ClusterCIDR string `json:"clusterCIDR"`
		NFTables    struct {
			MasqueradeBit int `json:"masqueradeBit"`
		} `json:"nftables"`
	}
	body := get("/configz")
	if err := json.Unmarshal([]byte(body), &configz); err != nil {
		t.Fatal(err)
	}
	c := configz["kubeproxy.config.k8s.io"]
	if c.Mode != "nftables" || c.ClusterCIDR != "10.244.0.0/16" || c.NFTables.MasqueradeBit != 13 {
		t.Errorf("/configz = %s", body)
	}
}

// TestApplySysctlsWritesOnlyChanges: as kube-proxy, a setting that already
// has its value (or, for nf_conntrack_max, more) is left alone, so a daemon
// whose /proc/sys is read-only starts once --init-only made the settings.
func TestApplySysctlsWritesOnlyChanges(t *testing.T) {
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	tests := []struct {
		name      string
		now       string
		s         sysctl
		want      string
		untouched bool
	}{
		{"same value", "86400", sysctl{name: "a", value: 86400}, "86400", true},
		{"other value", "432000", sysctl{name: "a", value: 86400}, "86400", false},
		{"raise only, larger", "262144", sysctl{name: "a", value: 131072, raiseOnly: true}, "262144", true},
		{"raise only, smaller", "65536", sysctl{name: "a", value: 131072, raiseOnly: true}, "131072", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := sysctlFS{root: t.TempDir()}
			path := filepath.Join(fs.root, tt.s.name)
			if err := os.WriteFile(path, []byte(tt.now+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(path, past, past); err != nil {
				t.Fatal(err)
			}
			if err := fs.apply(zap.NewNop(), []sysctl{tt.s}); err != nil {
				t.Fatal(err)
			}
			got, err := fs.read(tt.s.name)
			if err != nil || strconv.Itoa(got) != tt.want {
				t.Errorf("value %d (%v), want %s", got, err, tt.want)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if untouched := fi.ModTime().Equal(past); untouched != tt.untouched {
				t.Errorf("file left alone: %v, want %v", untouched, tt.untouched)
			}
		})
	}
}
