package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

func TestCleanupKubeProxyFromConfigOrFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("kind: KubeProxyConfiguration\ncleanupKubeProxy: true\n"), 0o644); err != nil {
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
