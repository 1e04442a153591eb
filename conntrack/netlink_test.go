package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	ct "github.com/ti-mo/conntrack"
)

// kernelRules DNATs a few service addresses in the test namespace's output
// hook: enough to make real conntrack entries with NAT'd reply tuples without
// nftproxy's ruleset.
const kernelRules = `
table inet nftproxy-cttest {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr 10.96.0.10 udp dport 53 dnat ip to 10.244.1.5:5353
		ip daddr 10.96.0.10 tcp dport 53 dnat ip to 10.244.1.5:5353
		ip daddr 10.96.0.11 udp dport 53 dnat ip to 10.244.1.6:5353
		ip6 daddr fd00:96::10 udp dport 53 dnat ip6 to [fd00:244::5]:5353
	}
}
`

// TestConnReconcileKernel sends real UDP and TCP packets in a fresh network
// namespace, dumps the resulting conntrack entries over netlink and
// reconciles them after an endpoint change.
func TestConnReconcileKernel(t *testing.T) {
	n := netns.New(t, "npct")
	// Packets leave through v0, whose peer v1 has no address and answers no
	// neighbor solicitation: they pass the output and postrouting hooks, so
	// their conntrack entries are confirmed, then die waiting for a neighbor.
	if err := n.IPBatch(
		"link add v0 type veth peer name v1",
		"link set v1 up",
		"link set v0 up",
		"addr add 10.0.0.1/24 dev v0",
		"addr add fd00::1/64 dev v0 nodad",
		"route add 10.96.0.0/16 dev v0",
		"route add 10.244.0.0/16 dev v0",
		"route add fd00:96::/64 dev v0",
		"route add fd00:244::/64 dev v0",
	); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(rules, []byte(kernelRules), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Exec("nft", "-f", rules); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	send := func(network, src, dst string) {
		t.Helper()
		if network == "tcp" {
			// The SYN goes into the dummy device and is never answered: the
			// dial times out and leaves a SYN_SENT entry behind.
			dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if c, err := n.DialFrom(dctx, network, src, dst); err == nil {
				c.Close()
				t.Fatalf("tcp %s -> %s connected, want a timeout", src, dst)
			}
			return
		}
		c, err := n.DialFrom(ctx, network, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatalf("send %s -> %s: %v", src, dst, err)
		}
	}
	send("udp", "10.0.0.1:40001", "10.96.0.10:53")
	send("udp", "10.0.0.1:40002", "10.96.0.11:53")
	send("tcp", "10.0.0.1:40003", "10.96.0.10:53")
	send("udp", "10.0.0.1:40004", "10.0.0.99:53")
	send("udp", "[fd00::1]:40005", "[fd00:96::10]:53")
	send("udp", "10.0.0.1:40006", "10.96.0.12:53")

	var (
		removed    = udp("10.0.0.1:40001", "10.96.0.10:53", "10.244.1.5:5353")
		stays      = udp("10.0.0.1:40002", "10.96.0.11:53", "10.244.1.6:5353")
		tcp        = flow(protoTCP, "10.0.0.1:40003", "10.96.0.10:53", "10.244.1.5:5353")
		notService = udp("10.0.0.1:40004", "10.0.0.99:53", "")
		removed6   = udp("[fd00::1]:40005", "[fd00:96::10]:53", "[fd00:244::5]:5353")
		rejected   = udp("10.0.0.1:40006", "10.96.0.12:53", "")
	)
	conn, err := Dial(n.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	before := dumpKeyed(t, conn)
	for _, want := range []Flow{removed, stays, tcp, notService, removed6, rejected} {
		got, ok := before[keyOfFlow(want)]
		if !ok {
			t.Fatalf("flow %s not in the dump: %v", want, before)
		}
		if diff := cmp.Diff(want, got, cmpAddrPort); diff != "" {
			t.Errorf("dumped flow mismatch (-want +got):\n%s", diff)
		}
	}

	ep := func(a string) k8s.Endpoint {
		return k8s.Endpoint{Addr: netip.MustParseAddr(a), Port: 5353, Ready: true, Serving: true}
	}
	sp := func(name string, proto k8s.Protocol, vips []string, eps ...k8s.Endpoint) k8s.ServicePort {
		s := k8s.ServicePort{Name: k8s.ServicePortName{Namespace: "ns", Name: name, Protocol: proto}, Port: 53, Endpoints: eps}
		for _, v := range vips {
			s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(v))
		}
		return s
	}
	dnsVIPs := []string{"10.96.0.10", "fd00:96::10"}
	prev := &k8s.Snapshot{Services: []k8s.ServicePort{
		sp("dns", k8s.UDP, dnsVIPs, ep("10.244.1.5"), ep("fd00:244::5")),
		sp("dns", k8s.TCP, dnsVIPs, ep("10.244.1.5")),
		sp("other", k8s.UDP, []string{"10.96.0.11"}, ep("10.244.1.6")),
		sp("empty", k8s.UDP, []string{"10.96.0.12"}),
	}}
	next := &k8s.Snapshot{Services: []k8s.ServicePort{
		sp("dns", k8s.UDP, dnsVIPs, ep("10.244.1.7"), ep("fd00:244::7")),
		sp("dns", k8s.TCP, dnsVIPs, ep("10.244.1.7")),
		sp("other", k8s.UDP, []string{"10.96.0.11"}, ep("10.244.1.6")),
		sp("empty", k8s.UDP, []string{"10.96.0.12"}, ep("10.244.1.8")),
	}}
	r := NewReconciler(conn)
	res, err := r.Reconcile(ctx, prev, next)
	if err != nil {
		t.Fatalf("Reconcile() error = %v", err)
	}
	if res.Deleted != 3 || res.Stale != 3 || res.Gone != 0 || res.Failed != 0 || res.Dumped < len(before) {
		t.Errorf("Reconcile() = %+v, want 3 of %d deleted", res, len(before))
	}
	t.Logf("reconciled %d flows in %v", res.Dumped, res.Duration)

	after := dumpKeyed(t, conn)
	for _, f := range []Flow{removed, removed6, rejected} {
		if _, ok := after[keyOfFlow(f)]; ok {
			t.Errorf("stale flow %s still in the table", f)
		}
	}
	for _, f := range []Flow{stays, tcp, notService} {
		if _, ok := after[keyOfFlow(f)]; !ok {
			t.Errorf("flow %s was deleted, want it kept", f)
		}
	}
	// Only the test's own flows: the kernel may add ICMPv6 ones meanwhile.
	if got, want := countProto(after, protoUDP, protoTCP), countProto(before, protoUDP, protoTCP)-3; got != want {
		t.Errorf("table has %d UDP and TCP flows after reconcile, want %d", got, want)
	}

	// A flow someone else removed: the kernel says ENOENT and Delete says so.
	if err := conn.Delete(ctx, removed); !errors.Is(err, ErrNotExist) {
		t.Errorf("Delete() of a deleted flow = %v, want ErrNotExist", err)
	}
	if res, err := r.Reconcile(ctx, next, next); err != nil || !res.Skipped {
		t.Errorf("Reconcile() without change = %+v, %v; want skipped", res, err)
	}
}

func dumpKeyed(t *testing.T, conn *Conn) map[fakeKey]Flow {
	t.Helper()
	flows, err := conn.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[fakeKey]Flow, len(flows))
	for _, f := range flows {
		m[keyOfFlow(f)] = f
	}
	if len(m) != len(flows) {
		t.Fatalf("dump has duplicate original tuples: %v", flows)
	}
	return m
}

func countProto(flows map[fakeKey]Flow, protos ...uint8) int {
	n := 0
	for _, f := range flows {
		if slices.Contains(protos, f.Proto) {
			n++
		}
	}
	return n
}

// BenchmarkReconcileKernel reconciles the 10,000 flows of benchFlows, 100 of
// them stale, in a real conntrack table: one dump, selection, 100 deletes.
// The deleted flows are put back outside the timer.
func BenchmarkReconcileKernel(b *testing.B) {
	n := netns.New(b, "npctb")
	flows, prev, next := benchFlows()
	raw, err := ct.Dial(&netlink.Config{NetNS: n.Fd()})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	create := func(fs []Flow) {
		for _, f := range fs {
			c := ct.Flow{Timeout: 600, TupleOrig: tuple(f.Proto, f.OrigSrc, f.OrigDst), TupleReply: tuple(f.Proto, f.ReplySrc, f.ReplyDst)}
			if err := raw.Create(c); err != nil {
				b.Fatalf("create flow %s: %v", f, err)
			}
		}
	}
	create(flows)
	stale := Stale(flows, prev, next)
	conn, err := Dial(n.Fd())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	r := NewReconciler(conn)
	ctx := context.Background()
	for b.Loop() {
		res, err := r.Reconcile(ctx, prev, next)
		if err != nil || res.Deleted != len(stale) || res.Dumped != len(flows) {
			b.Fatalf("Reconcile() = %+v, %v; want %d of %d deleted", res, err, len(stale), len(flows))
		}
		b.StopTimer()
		create(stale)
		b.StartTimer()
	}
}
