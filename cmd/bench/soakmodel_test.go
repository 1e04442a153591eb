package main

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSoakModelKeepsServicesReady replays a churn and checks what the soak
// promises its clients: every service keeps all its ready endpoints at
// every step, no address serves two services, and the pool comes back whole.
func TestSoakModelKeepsServicesReady(t *testing.T) {
	pool := netip.MustParsePrefix("10.128.0.0/22") // 1,024 addresses
	w := workloadSpec{services: 50, width: uniform(3)}.generate()
	m := newSoakModel(w, pool, 1)
	if got, want := len(m.free), 1024-150; got != want {
		t.Fatalf("free addresses: %d, want %d", got, want)
	}
	type pending struct {
		svc  int
		addr netip.Addr
	}
	var retiring []pending
	for step := range 2000 {
		r, ok := m.replace()
		if !ok {
			t.Fatalf("step %d: no replacement", step)
		}
		if r.added == r.retiring || !pool.Contains(r.added) {
			t.Fatalf("step %d: replacement %+v", step, r)
		}
		retiring = append(retiring, pending{r.svc, r.retiring})
		if len(retiring) > 20 { // a grace period of 20 changes
			m.remove(retiring[0].svc, retiring[0].addr)
			retiring = retiring[1:]
		}
		owner := map[netip.Addr]int{}
		for i, eps := range m.endpointsOf {
			ready := 0
			for _, e := range eps {
				if !e.terminating {
					ready++
				}
				if prev, dup := owner[e.addr]; dup {
					t.Fatalf("step %d: %s in services %d and %d", step, e.addr, prev, i)
				}
				owner[e.addr] = i
			}
			if ready != 3 {
				t.Fatalf("step %d: service %d has %d ready endpoints, want 3", step, i, ready)
			}
		}
		for _, a := range m.free {
			if _, used := owner[a]; used {
				t.Fatalf("step %d: %s is free and in use", step, a)
			}
		}
		if m.terminating.Load() != int64(len(retiring)) {
			t.Fatalf("step %d: %d terminating counted, want %d", step, m.terminating.Load(), len(retiring))
		}
		if len(owner)+len(m.free) != 1024 {
			t.Fatalf("step %d: %d in use + %d free, want 1024", step, len(owner), len(m.free))
		}
	}
}

func TestSoakModelEndpointsIsACopy(t *testing.T) {
	m := newSoakModel(workloadSpec{services: 1, width: uniform(3)}.generate(), netip.MustParsePrefix("10.128.0.0/24"), 1)
	eps := m.endpoints(0)
	if _, ok := m.replace(); !ok {
		t.Fatal("no replacement")
	}
	if len(eps) != 3 || eps[0].terminating || eps[1].terminating || eps[2].terminating {
		t.Fatalf("copy changed with the model: %+v", eps)
	}
}

func TestAddrOwners(t *testing.T) {
	o := &addrOwners{}
	a := netip.MustParseAddr("10.128.3.4")
	if _, ok := o.get(a); ok {
		t.Fatal("owner before set")
	}
	o.set(a, 0)
	if svc, ok := o.get(a); !ok || svc != 0 {
		t.Fatalf("get = %d, %v; want 0, true", svc, ok)
	}
	o.set(a, -1)
	if _, ok := o.get(a); ok {
		t.Fatal("owner after clear")
	}
}

func TestRecentRing(t *testing.T) {
	r := newRecentRing(4)
	rng := rand.New(rand.NewPCG(1, 2))
	if _, ok := r.pick(rng); ok {
		t.Fatal("pick from an empty ring")
	}
	for svc := range 10 {
		r.push(svc)
	}
	for range 100 {
		if svc, ok := r.pick(rng); !ok || svc < 6 {
			t.Fatalf("pick = %d, %v; want one of the last four pushed", svc, ok)
		}
	}
}

func TestSoakPodRanges(t *testing.T) {
	want := []string{"10.128.0.0/18", "10.128.64.0/18", "10.128.128.0/18", "10.128.192.0/18"}
	for k, w := range want {
		if got := soakPodRange(k).String(); got != w {
			t.Errorf("pod %d: %s, want %s", k, got, w)
		}
	}
}

func TestGrouped(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 84132: "84,132", 1234567: "1,234,567"} {
		if got := grouped(n); got != want {
			t.Errorf("grouped(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSyncTimes(t *testing.T) {
	log := `{"level":"info","ts":"2026-11-25T08:00:00.500Z","msg":"Synced","full":true,"took":1.5}
{"level":"info","ts":"2026-11-25T08:00:01.000Z","msg":"Resync skipped"}
{"level":"info","ts":"2026-11-25T08:00:02.000Z","msg":"Synced","full":false,"took":0.0125}
{"level":"info","ts":"2026-11-25T08:00:03.000Z","msg":"Synced","full":false,"took":0.02}
{"level":"info","ts":"2026-11-25T08:00:09.000Z","msg":"Synced","full":false,"took":0.5}
`
	from := time.Date(2026, 11, 25, 8, 0, 1, 0, time.UTC)
	got, err := syncTimes(log, from, from.Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{12.5, 20}; !slices.Equal(got, want) {
		t.Errorf("syncTimes = %v, want %v", got, want)
	}
}

func TestEventLogSince(t *testing.T) {
	var l eventLog[int]
	for i := range 5 {
		l.add(i)
	}
	if got := l.since(3); !slices.Equal(got, []int{3, 4}) {
		t.Errorf("since(3) = %v, want [3 4]", got)
	}
	if got := l.since(9); len(got) != 0 {
		t.Errorf("since(9) = %v, want none", got)
	}
}

// TestDescribe checks an address's history: every write that named it, in
// the order they were queued.
func TestDescribe(t *testing.T) {
	a, b := netip.MustParseAddr("10.128.0.7"), netip.MustParseAddr("10.128.0.8")
	at := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	writes := []soakWrite{
		{soakChange: soakChange{svc: 2, added: b, retiring: a}, queued: at.Add(time.Second), written: at.Add(2 * time.Second)},
		{soakChange: soakChange{svc: 2, added: a}, queued: at, written: at.Add(10 * time.Millisecond)},
		{soakChange: soakChange{svc: 2, removed: a}, queued: at.Add(3 * time.Second), written: at.Add(3 * time.Second),
			err: errors.New("boom")},
	}
	want := []string{
		"08:00:00.000 10.128.0.7 svc 2: added as ready queued, written 08:00:00.010",
		"08:00:01.000 10.128.0.7 svc 2: made terminating queued, written 08:00:02.000",
		"08:00:03.000 10.128.0.7 svc 2: pod exited, removal queued, failed: boom",
	}
	if got := describe(writes, a); !slices.Equal(got, want) {
		t.Errorf("describe =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
