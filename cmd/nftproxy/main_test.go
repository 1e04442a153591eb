package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
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

func TestConfigFileFillsWhatFlagsDoNotSet(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	config := `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clusterCIDR: 10.244.0.0/16
metricsBindAddress: 127.0.0.1:9999
enableProfiling: true
nodePortAddresses: [192.168.0.0/16]
nftables:
  masqueradeAll: true
  syncPeriod: 1m
`
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var o options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse([]string{"--config", file, "--metrics-bind-address", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := o.applyConfigFile(fs); err != nil {
		t.Fatal(err)
	}
	if o.clusterCIDRs != "10.244.0.0/16" || !o.masqueradeAll || o.syncPeriod != time.Minute ||
		o.nodePortAddresses != "192.168.0.0/16" || o.metricsBindAddress != "127.0.0.1:1" || !o.profiling {
		t.Errorf("options after the config file: %+v", o)
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
