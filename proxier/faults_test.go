package proxier

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/nftmodel/nlfault"
)

// faultSnapshots are a representative change: one service's endpoints
// change (3 → 2, a count change), one goes, one comes with a NodePort and
// session affinity.
func faultSnapshots() (before, after *k8s.Snapshot) {
	affinity := func(sp *k8s.ServicePort) { sp.AffinityTimeout = 3 * time.Hour }
	before = &k8s.Snapshot{Services: []k8s.ServicePort{
		svc("api", "http", "10.96.0.11", 1),
		svc("gone", "http", "10.96.0.12", 2),
		svc("web", "http", "10.96.0.10", 3),
	}}
	after = &k8s.Snapshot{Services: []k8s.ServicePort{
		svc("api", "http", "10.96.0.11", 1),
		svc("new", "http", "10.96.0.13", 2, nodePort(30080), affinity),
		svc("web", "http", "10.96.0.10", 2),
	}}
	return before, after
}

// faultRig is a proxier on a real kernel in a test namespace, whose batches
// go through a fault injector.
type faultRig struct {
	t    *testing.T
	ns   *netns.NS
	conn *nftnl.Conn
	in   *nlfault.Injector
}

func newFaultRig(t *testing.T) *faultRig {
	ns := netns.New(t, "pxf")
	conn, err := nftnl.Dial(ns.Fd())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	conn.SendTimeout = 200 * time.Millisecond
	return &faultRig{t: t, ns: ns, conn: conn, in: nlfault.Wrap(conn)}
}

// fresh deletes the table and returns a new proxier, its logs and metrics.
func (r *faultRig) fresh() (*Proxier, *observer.ObservedLogs, *Metrics) {
	r.t.Helper()
	if err := nftnl.Delete(r.conn, m.IPv4, TableName); err != nil {
		r.t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	mt := NewMetrics()
	p := New(Options{Configs: []Config{testConfig}, Kernel: nftnl.Kernel{Conn: r.conn}, Logger: zap.New(core), Metrics: mt})
	return p, logs, mt
}

func (r *faultRig) list() string {
	r.t.Helper()
	out, err := r.ns.Exec("nft", "list", "table", "ip", TableName)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *faultRig) sync(p *Proxier, snap *k8s.Snapshot, full bool) {
	r.t.Helper()
	if err := p.Sync(context.Background(), snap, full); err != nil {
		r.t.Fatal(err)
	}
}

// refusedNames are the words naming the object of each kind of nftables
// message in an error (the batch's step descriptions).
var refusedNames = map[uint16][]string{
	unix.NFT_MSG_NEWTABLE:   {"add table"},
	unix.NFT_MSG_DELTABLE:   {"delete table"},
	unix.NFT_MSG_NEWCHAIN:   {"add chain"},
	unix.NFT_MSG_DELCHAIN:   {"delete chain"},
	unix.NFT_MSG_NEWRULE:    {"add rule"},
	unix.NFT_MSG_DELRULE:    {"flush chain", "flush rules of table"},
	unix.NFT_MSG_NEWSET:     {"add set", "add anonymous map"},
	unix.NFT_MSG_DELSET:     {"delete set"},
	unix.NFT_MSG_NEWSETELEM: {"elements of set", "add anonymous map"},
	unix.NFT_MSG_DELSETELEM: {"elements of set", "flush set"},
}

// wantNamed returns what the error for a refusal of message i (of types)
// must say: the message's number, and one of the ways its object is named.
func wantNamed(types []uint16, i int) []string {
	switch i {
	case 0:
		return []string{"refused at its begin"}
	case len(types) - 1:
		return []string{"refused at its end"}
	}
	return append([]string{fmt.Sprintf("message %d of %d: ", i, len(types)-2)}, refusedNames[types[i]&0xff]...)
}

// TestSyncFaults fails a representative delta batch, and a full one, at
// every message in turn (the kernel refuses it) and with every other fault
// of the netlink seam, through the proxier's Sync on a real kernel. After
// each: the kernel holds exactly the previous ruleset (or, where the kernel
// got a valid batch and only its replies were lost, the new one), the
// failure is logged naming the refused object and counted, and the next
// sync, asked as a delta, is full and brings the table to the new ruleset.
func TestSyncFaults(t *testing.T) {
	r := newFaultRig(t)
	one, two := faultSnapshots()

	// The batches' messages, and the listings a full sync of two leaves
	// after one (old) and after one and two (new).
	batchTypes := map[bool][]uint16{}
	healed := map[string]string{}
	for _, full := range []bool{false, true} {
		p, _, _ := r.fresh()
		r.sync(p, one, false)
		r.sync(p, two, full)
		batchTypes[full] = r.in.LastTypes()
		r.sync(p, two, true)
		healed[fmt.Sprintf("new %v", full)] = r.list()
	}
	p, _, _ := r.fresh()
	r.sync(p, one, false)
	r.sync(p, two, true)
	healed["old"] = r.list()

	type faultCase struct {
		fault     nlfault.Fault
		full      bool
		committed bool // the kernel got a valid batch: it may hold the new ruleset
		named     []string
	}
	var cases []faultCase
	for _, full := range []bool{false, true} {
		types := batchTypes[full]
		for i := range types {
			cases = append(cases, faultCase{fault: nlfault.Fault{Kind: nlfault.Refuse, Index: i}, full: full, named: wantNamed(types, i)})
		}
		cases = append(cases,
			faultCase{fault: nlfault.Fault{Kind: nlfault.ShortRead, Index: len(types) / 2}, full: full, named: []string{"parse replies"}},
			faultCase{fault: nlfault.Fault{Kind: nlfault.SendError, Errno: unix.ENOBUFS}, full: full, named: []string{"send batch", "no buffer space"}},
			faultCase{fault: nlfault.Fault{Kind: nlfault.SendError, Errno: unix.EINTR}, full: full, named: []string{"send batch", "interrupted"}},
			faultCase{fault: nlfault.Fault{Kind: nlfault.SendError, Errno: unix.EBUSY}, full: full, named: []string{"send batch", "busy"}},
			faultCase{fault: nlfault.Fault{Kind: nlfault.Stall}, full: full, named: []string{"send batch", "i/o timeout"}},
			faultCase{fault: nlfault.Fault{Kind: nlfault.LoseReplies, Errno: unix.ENOBUFS}, full: full, committed: true,
				named: []string{"the kernel may have committed it", "no buffer space"}},
		)
	}
	if n := len(batchTypes[false]); n < 10 {
		t.Fatalf("the delta batch has %d messages; the case is not representative", n)
	}
	t.Logf("delta batch: %d messages, full batch: %d messages, %d cases", len(batchTypes[false]), len(batchTypes[true]), len(cases))

	for _, tc := range cases {
		kind := "delta"
		if tc.full {
			kind = "full"
		}
		t.Run(fmt.Sprintf("%s/%v", kind, tc.fault), func(t *testing.T) {
			r.t = t
			p, logs, mt := r.fresh()
			r.sync(p, one, false)
			before := r.list()

			r.in.Next(tc.fault)
			err := p.Sync(context.Background(), two, tc.full)
			if err == nil {
				t.Fatal("Sync succeeded through the fault")
			}
			after := r.list()
			switch {
			case after == before:
			case tc.committed && after == healed["new "+fmt.Sprint(tc.full)]:
			default:
				t.Errorf("after the failed batch the kernel holds neither the previous ruleset nor the new one:\n%s", after)
			}
			if got := counterValue(t, mt.SyncFailures); got != 1 {
				t.Errorf("nftproxy_sync_failures_total = %v, want 1", got)
			}
			failed := logs.FilterMessageSnippet("Sync failed").All()
			if len(failed) != 1 {
				t.Fatalf("%d failure log lines, want 1", len(failed))
			}
			logged := fmt.Sprint(failed[0].ContextMap()["error"])
			if !says(logged, tc.named) {
				t.Errorf("logged error %q does not say %q", logged, tc.named)
			}

			fulls := counterValue(t, mt.FullSyncs)
			r.sync(p, two, false)
			if got := counterValue(t, mt.FullSyncs); got != fulls+1 {
				t.Errorf("the sync after the failure was not full")
			}
			want := healed["old"]
			if after != before {
				want = healed["new "+fmt.Sprint(tc.full)]
			}
			if got := r.list(); got != want {
				t.Errorf("after the healing sync the table is not the new ruleset:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// says tells whether s says every phrase of want, or, when want names a
// message, the message and one of the names its object may have.
func says(s string, want []string) bool {
	if len(want) > 1 && strings.HasPrefix(want[0], "message ") {
		if !strings.Contains(s, want[0]) {
			return false
		}
		for _, w := range want[1:] {
			if strings.Contains(s, w) {
				return true
			}
		}
		return false
	}
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// TestSyncKernelRefusals makes the kernel itself refuse a delta batch,
// because another program put something in nftproxy's table between two
// syncs: an element of an endpoint map under the key the delta adds (with
// another value), and a base chain under the name of a chain the delta adds
// and points a verdict at. The kernel keeps the table as it was, the
// failure names the refused object, and the next sync, full, repairs it.
func TestSyncKernelRefusals(t *testing.T) {
	r := newFaultRig(t)
	one := &k8s.Snapshot{Services: []k8s.ServicePort{svc("api", "http", "10.96.0.11", 1)}}
	two := &k8s.Snapshot{Services: []k8s.ServicePort{svc("api", "http", "10.96.0.11", 1), svc("extra", "http", "10.96.0.20", 5)}}
	p, _, _ := r.fresh()
	r.sync(p, one, false)
	r.sync(p, two, true)
	healed := r.list()

	for _, tc := range []struct {
		name   string
		tamper []string
		named  string
	}{
		{"element clash", []string{"add", "element", "ip", TableName, "endpoints", "{ 10.96.0.20 . tcp . 80 . 0 : 10.244.9.9 . 9999 }"},
			"elements of set endpoints"},
		{"base chain in the way", []string{"add", "chain", "ip", TableName, "cluster-ip-5", "{ type filter hook input priority 0; }"},
			"elements of set service-ips"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			p, logs, mt := r.fresh()
			r.sync(p, one, false)
			if _, err := r.ns.Exec(append([]string{"nft"}, tc.tamper...)...); err != nil {
				t.Fatal(err)
			}
			before := r.list()
			err := p.Sync(context.Background(), two, false)
			if err == nil {
				t.Fatal("the kernel took the delta")
			}
			if after := r.list(); after != before {
				t.Errorf("the refused batch changed the table:\n%s\nwas:\n%s", after, before)
			}
			if counterValue(t, mt.SyncFailures) != 1 {
				t.Error("failure not counted")
			}
			failed := logs.FilterMessageSnippet("Sync failed").All()
			if len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), tc.named) {
				t.Errorf("failure logged as %v, want one line naming %q", failed, tc.named)
			} else {
				t.Logf("logged: %v", failed[0].ContextMap()["error"])
			}
			r.sync(p, two, false)
			if got := r.list(); got != healed {
				t.Errorf("the next sync did not repair the table:\n%s\nwant:\n%s", got, healed)
			}
		})
	}
}
