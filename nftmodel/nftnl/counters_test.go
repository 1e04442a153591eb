package nftnl

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// countedDrop is table ip t: its output chain counts and drops what goes
// to 127.0.0.2.
func countedDrop() *nftmodel.Ruleset {
	return &nftmodel.Ruleset{Family: nftmodel.IPv4, Table: "t", Chains: []*nftmodel.Chain{
		nlBase("out", nftmodel.TypeFilter, nftmodel.HookOutput, 0, nlRule(
			nftmodel.MatchPrefix{Field: nftmodel.FieldDaddr, Prefix: pfx("127.0.0.2/32")}, nftmodel.Counter{}, nftmodel.Verdict{Kind: nftmodel.Drop})),
	}}
}

// TestCounterPackets: a rule's counter counts the packets that reach it;
// CounterPackets reads them, Read renders them as nft lists them, and a
// full Apply writes the rule anew, from zero.
func TestCounterPackets(t *testing.T) {
	ns, conn := nftNS(t)
	rs := countedDrop()
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	if n, err := CounterPackets(conn, nftmodel.IPv4, "t", "out"); err != nil || n != 0 {
		t.Fatalf("before traffic: %d, %v", n, err)
	}
	if _, err := ns.IP("link", "set", "lo", "up"); err != nil {
		t.Fatal(err)
	}
	c, err := ns.Dial(t.Context(), "udp4", "127.0.0.2:9")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = c.Write([]byte("x")) // dropped: 29 bytes each
	}
	_ = c.Close()
	n, err := CounterPackets(conn, nftmodel.IPv4, "t", "out")
	if err != nil || n != 3 {
		t.Errorf("after three datagrams: %d, %v, want 3", n, err)
	}
	read, err := Read(conn, nftmodel.IPv4, "t")
	if err != nil {
		t.Fatal(err)
	}
	listed, err := ns.Exec("nft", "list", "table", "ip", "t")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(listed, nftmodel.Render(read)); d != "" {
		t.Errorf("read back (-nft +rendered):\n%s", d)
	}
	if !strings.Contains(listed, "counter packets 3 bytes 87") {
		t.Errorf("nft list: %s, want the three datagrams counted", listed)
	}
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	if n, err := CounterPackets(conn, nftmodel.IPv4, "t", "out"); err != nil || n != 0 {
		t.Errorf("after a full apply: %d, %v, want 0", n, err)
	}
	if n, err := CounterPackets(conn, nftmodel.IPv4, "missing", "out"); err != nil || n != 0 {
		t.Errorf("missing table: %d, %v, want 0 and no error", n, err)
	}
}

// TestConcurrentReadsAndApplies: the daemon reads counters for a /metrics
// scrape while its sync loop applies and reads the generation, on one
// connection. The library's lasting socket is shared by both: requests in
// flight at once read each other's replies ("mismatched sequence in netlink
// reply"), and a reply taken by the wrong caller leaves the other blocked
// for good (a daemon that stopped answering and did not stop). Every call
// must succeed, and in bounded time.
func TestConcurrentReadsAndApplies(t *testing.T) {
	_, conn := nftNS(t)
	rs := countedDrop()
	if _, err := Apply(conn, rs); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() {
		for range 300 {
			if _, err := CounterPackets(conn, nftmodel.IPv4, "t", "out"); err != nil {
				done <- fmt.Errorf("read counters: %w", err)
				return
			}
		}
		done <- nil
	}()
	go func() {
		for range 100 {
			if _, err := Generation(conn); err != nil {
				done <- fmt.Errorf("read generation: %w", err)
				return
			}
			if _, err := Apply(conn, rs); err != nil {
				done <- fmt.Errorf("apply: %w", err)
				return
			}
		}
		done <- nil
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a call blocked: a reply went to the wrong caller")
		}
	}
}
