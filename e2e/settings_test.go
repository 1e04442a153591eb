package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// TestDetectLocalModes checks each detectLocalMode's masquerade decision with
// real connections to a ClusterIP: the pod sees the outside client as the
// node (masqueraded) or as itself, and the in-cluster client (on the pod
// bridge, 10.244.1.100) as itself. masqueradeBit 13 rides along with the
// default mode: the mark in the ruleset is 0x2000 and masquerade still works.
func TestDetectLocalModes(t *testing.T) {
	const vip = "10.96.0.90"
	node := `apiVersion: v1
kind: Node
metadata:
  name: node-1
spec:
  podCIDRs: [10.244.1.0/24]
status:
  addresses:
  - {type: InternalIP, address: 192.168.77.1}
`
	tests := []struct {
		name       string
		args       []string
		outsideMsq bool // the outside client is masqueraded
		mark       string
	}{
		{"ClusterCIDRWithMasqueradeBit13", []string{"--iptables-masquerade-bit", "13"}, true, "0x00002000"},
		{"NodeCIDR", []string{"--detect-local-mode", "NodeCIDR"}, true, "0x00004000"},
		{"BridgeInterface", []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", netns.BridgeName}, true, "0x00004000"},
		// Routed from a bridge port, a packet's input interface is the bridge.
		{"InterfaceNamePrefix", []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "br"}, true, "0x00004000"},
		{"None", []string{"--detect-local-mode", "None"}, false, "0x00004000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScenario(t, 1, nil, tt.args...)
			s.write("node.yaml", node)
			s.change(func() {
				s.write("web.yaml", svcSpec{name: "web", clusterIP: vip, port: 80, endpoints: []string{s.topo.Pods[0].Addr.String()}}.yaml())
			})
			addr := netip.AddrPortFrom(netip.MustParseAddr(vip), 80)
			want := netns.ClientAddr
			if tt.outsideMsq {
				want = netns.BridgeAddr
			}
			if got := s.semPeer(s.topo.Client, netip.Addr{}, addr); got != want {
				t.Errorf("the pod saw the outside client as %s, want %s", got, want)
			}
			inCluster := s.topo.InClusterClient
			if got := s.semPeer(inCluster.NS, netip.Addr{}, addr); got != inCluster.Addr {
				t.Errorf("the pod saw the in-cluster client %s as %s, want it unmasqueraded", inCluster.Addr, got)
			}
			out, err := s.topo.Node.Exec("nft", "list", "chain", "ip", "nftproxy", "mark-for-masquerade")
			if err != nil || !strings.Contains(out, tt.mark) {
				t.Errorf("mark-for-masquerade lacks %s: %s %v", tt.mark, out, err)
			}
		})
	}
}

// TestConntrackTuning: the conntrack settings kube-proxy makes at start-up
// are read back in the node's namespace, and with tcpBeLiberal the ruleset
// drops nothing conntrack calls invalid (kube-proxy's rule).
func TestConntrackTuning(t *testing.T) {
	s := newScenario(t, 1, nil, "--conntrack-tcp-timeout-established", "2h", "--conntrack-tcp-timeout-close-wait", "30m",
		"--conntrack-udp-timeout", "45s", "--conntrack-udp-timeout-stream", "150s", "--conntrack-tcp-be-liberal")
	want := map[string]int{
		"nf_conntrack_tcp_timeout_established": 7200,
		"nf_conntrack_tcp_timeout_close_wait":  1800,
		"nf_conntrack_udp_timeout":             45,
		"nf_conntrack_udp_timeout_stream":      150,
		"nf_conntrack_tcp_be_liberal":          1,
	}
	err := s.topo.Node.Do(func() error {
		for name, v := range want {
			b, err := os.ReadFile(filepath.Join("/proc/sys/net/netfilter", name))
			if err != nil {
				return err
			}
			if got, _ := strconv.Atoi(strings.TrimSpace(string(b))); got != v {
				t.Errorf("%s = %d, want %d", name, got, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.topo.Node.Exec("nft", "list", "table", "ip", "nftproxy")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "ct state invalid") {
		t.Errorf("tcpBeLiberal set, yet invalid packets are dropped:\n%s", out)
	}
	for _, l := range s.logLines("Skipping nf_conntrack_max: it cannot be set from this network namespace") {
		t.Logf("nf_conntrack_max skipped, as expected in a network namespace: %v", l["error"])
	}
}

// readOnlyProcSys runs argv with /proc/sys mounted read-only, as a container
// runtime mounts it in a container that is not privileged.
var readOnlyProcSys = []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
	`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"`}

// TestReadOnlyProcSys: the DaemonSet's way. With /proc/sys read-only the
// daemon refuses to start while a conntrack setting differs, naming
// --init-only; once `run --init-only` made the settings with a writable
// /proc/sys (the privileged init container), it starts, writes nothing, and
// serves.
func TestReadOnlyProcSys(t *testing.T) {
	if binary == "" {
		netns.Require(t)
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "e2ro", Pods: 1})
	if _, err := topo.Pods[0].ServeName("tcp", 8080); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	vip := netip.MustParseAddrPort("10.96.0.91:80")
	web := svcSpec{name: "web", clusterIP: vip.Addr().String(), port: 80, endpoints: []string{topo.Pods[0].Addr.String()}}.yaml()
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(web), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--manifests", dir, "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "", "--metrics-bind-address", "", "--conntrack-tcp-timeout-established", "3h"}
	const setting = "nf_conntrack_tcp_timeout_established"

	out, err := topo.Node.Exec(append(append(readOnlyProcSys, binary), args...)...)
	if err == nil || !strings.Contains(out, "read-only file system") || !strings.Contains(out, "--init-only") {
		t.Fatalf("read-only /proc/sys before --init-only: %v, want a refusal naming --init-only:\n%s", err, out)
	}
	if out, err := topo.Node.Exec(append([]string{binary}, append(args, "--init-only")...)...); err != nil {
		t.Fatalf("--init-only: %v\n%s", err, out)
	}
	got, err := topo.Node.Exec("cat", "/proc/sys/net/netfilter/"+setting)
	if err != nil || strings.TrimSpace(got) != "10800" {
		t.Fatalf("%s after --init-only: %q %v, want 10800", setting, got, err)
	}

	d, err := StartCommand(topo.Node, readOnlyProcSys[0], append(append(readOnlyProcSys[1:], binary), args...)...)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, d)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := d.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.Log(), `"msg":"Set sysctl"`) {
		t.Errorf("a setting was written with /proc/sys read-only:\n%s", d.Log())
	}
	if name, err := topo.Client.AskTCP(ctx, vip); err != nil || name != topo.Pods[0].Name {
		t.Errorf("ask %s: %q %v, want %s", vip, name, err, topo.Pods[0].Name)
	}
}
