package proxier

import (
	"slices"
	"sync"
	"time"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// tamper is what a read of nftables notifications tells about our tables.
type tamper int

const (
	tamperNone    tamper = iota
	tamperUnknown        // notifications were lost: the generation must tell
	tamperForeign        // another program changed one of our tables
)

// classify tells whether events show another program changing the table
// TableName of one of families: an event of that table whose port is not
// one of ours (own). Events of other tables, our own commits and
// generations don't count.
func classify(events []m.Event, families []m.Family, own func(port uint32) bool) tamper {
	t := tamperNone
	for _, e := range events {
		if e.Lost {
			t = tamperUnknown
			continue
		}
		if e.Table != TableName || e.Type == m.EventNewGen {
			continue
		}
		f, ok := m.FamilyOf(e.Family)
		if !ok || !slices.Contains(families, f) {
			continue
		}
		if own == nil || !own(e.Port) {
			return tamperForeign
		}
	}
	return t
}

// driftSignal hands the tamper a notification reader found to the sync
// loop: the worst since the loop last took it, signalled at most once.
type driftSignal struct {
	mu    sync.Mutex
	worst tamper
	last  time.Time // when the last tamper was raised
	ready chan struct{}
}

func newDriftSignal() *driftSignal { return &driftSignal{ready: make(chan struct{}, 1)} }

func (d *driftSignal) raise(t tamper) {
	if t == tamperNone {
		return
	}
	d.mu.Lock()
	d.worst = max(d.worst, t)
	d.last = time.Now()
	d.mu.Unlock()
	select {
	case d.ready <- struct{}{}:
	default:
	}
}

// settledBy forgets what was raised before a full sync that started at
// start: one tamper's notifications come in several reads, and the sync
// read the kernel after all of them.
func (d *driftSignal) settledBy(start time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.worst != tamperNone && d.last.Before(start) {
		d.worst = tamperNone
		select {
		case <-d.ready:
		default:
		}
	}
}

func (d *driftSignal) take() tamper {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.worst
	d.worst = tamperNone
	return t
}

// Notify takes nftables notifications of the proxier's namespace (the
// callback of nftnl.Watch): when another program changed nftproxy's
// tables, Run starts a full sync at once (at most one per MinSyncPeriod)
// instead of waiting for SyncPeriod.
func (p *Proxier) Notify(events []m.Event) {
	families := make([]m.Family, len(p.opts.Configs))
	for i, c := range p.opts.Configs {
		families[i] = c.Family
	}
	p.drift.raise(classify(events, families, p.opts.OwnPort))
}
