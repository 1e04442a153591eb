package nftnl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/nftmodel"
)

// BenchmarkApplyWatched prints what a listener on the nftables group costs
// a full apply of a 100,000-element set: with a listener the kernel writes
// a notification of every element; paused (out of the group during the
// apply, as the proxier does) it writes none. Root.
func BenchmarkApplyWatched(b *testing.B) {
	ns := netns.New(b, "nftwatch")
	conn, err := Dial(ns.Fd())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rs := bigSetRuleset(100_000)
	for _, name := range []string{"unwatched", "watched", "paused"} {
		watched, paused := name != "unwatched", name == "paused"
		b.Run(name, func(b *testing.B) {
			var events, lost atomic.Int64
			var w *Watcher
			if watched {
				if w, err = NewWatcher(ns.Fd()); err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					_ = w.Run(ctx, func(es []nftmodel.Event) {
						for _, e := range es {
							if e.Lost {
								lost.Add(1)
							}
						}
						events.Add(int64(len(es)))
					})
				}()
				defer func() { cancel(); <-done }()
				time.Sleep(100 * time.Millisecond) // subscribed
			}
			for b.Loop() {
				if paused {
					_ = w.Pause()
				}
				if _, err := Apply(conn, rs); err != nil {
					b.Fatal(err)
				}
				if paused {
					_ = w.Resume()
				}
			}
			b.ReportMetric(float64(events.Load())/float64(b.N), "events/op")
			b.ReportMetric(float64(lost.Load())/float64(b.N), "overflows/op")
		})
	}
}
