package e2e

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestDriftRepairedAtOnce: another program flushes the ruleset, deletes the
// service's endpoint map element, deletes the table, while a client
// connects to the ClusterIP every 50 ms; nftproxy (whose --sync-period is an
// hour) sees the nftables notifications and puts its rules back in under a
// second (printed; asserted under 5 s, far below the period).
func TestDriftRepairedAtOnce(t *testing.T) {
	s := newScenario(t, 1, webManifests("10.244.1.10"), "--sync-period", "1h")
	list := func() string {
		out, _ := s.topo.Node.Exec("nft", "list", "table", "ip", "nftproxy")
		return out
	}
	want := list()

	// The client: one connection every 50 ms, each failure's time kept.
	var mu sync.Mutex
	var lastFailure time.Time
	var asked, failed int
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			actx, acancel := context.WithTimeout(ctx, 40*time.Millisecond)
			_, err := s.topo.Client.AskTCP(actx, webVIP)
			acancel()
			mu.Lock()
			asked++
			if err != nil && ctx.Err() == nil {
				failed++
				lastFailure = time.Now()
			}
			mu.Unlock()
		}
	}()
	defer func() { cancel(); <-done }()

	for _, tamper := range [][]string{
		{"flush", "ruleset"},
		{"delete", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.10 . tcp . 80 . 0 }"},
		{"delete", "table", "ip", "nftproxy"},
	} {
		time.Sleep(300 * time.Millisecond) // connections succeed meanwhile
		mu.Lock()
		failedBefore := failed
		mu.Unlock()
		start := time.Now()
		if _, err := s.topo.Node.Exec(append([]string{"nft"}, tamper...)...); err != nil {
			t.Fatal(err)
		}
		for list() != want {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("nft %v: rules not back after 5 s; log:\n%s", tamper, s.d.Log())
			}
			time.Sleep(10 * time.Millisecond)
		}
		back := time.Since(start)
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		lost, failing := failed-failedBefore, time.Duration(0)
		if lost > 0 {
			failing = lastFailure.Sub(start)
		}
		mu.Unlock()
		t.Logf("nft %v: rules back after %v; %d connections failed, the last %v after the change",
			tamper, back.Round(time.Millisecond), lost, failing.Round(time.Millisecond))
		// The goal is under a second, which this machine meets
		// when it is not overloaded; the assertion only proves the
		// notifications, not the hour-long --sync-period, did it.
		if back > 5*time.Second {
			t.Errorf("nft %v: rules back after %v", tamper, back)
		}
	}
	mu.Lock()
	t.Logf("%d connections in all, %d failed", asked, failed)
	mu.Unlock()

	// Our own syncs are not taken for tampering: no repair without one.
	repairs := len(s.logLines("Another program changed nftproxy's tables; full sync"))
	syncs := s.d.Syncs()
	time.Sleep(time.Second)
	if n := s.d.Syncs(); n != syncs {
		t.Errorf("%d syncs in a quiet second after the repairs", n-syncs)
	}
	if repairs < 3 {
		t.Errorf("%d drift repairs logged, want at least 3", repairs)
	}
}
