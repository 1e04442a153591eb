package e2e

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/e2e/prom"
)

// These scenarios show what the conntrack reconciler is for: without it, a
// UDP client that keeps its source port keeps its old DNAT decision for as
// long as it keeps talking. Each runs once with the reconciler (the default)
// and once with --conntrack=false, which must leave the client stuck: that
// proves the scenario would catch a reconciler that does nothing.

const (
	ctDNSVIP      = "10.96.0.53"
	ctDNSNodePort = 30053
	ctInterval    = 50 * time.Millisecond // how often the clients send
	// ctSwitchWithin bounds the time from the sync that applied a change to
	// the first datagram answered under the new rules: the reconcile right
	// after that sync plus a few send intervals.
	ctSwitchWithin = time.Second
	// ctStuckFor is how long a client without the reconciler must stay stuck.
	ctStuckFor = time.Second
)

// ctAsk sends one datagram from local to remote in the client namespace and
// returns the answering pod's name. A fresh socket each time, bound to the
// same source port, keeps the flow (and its conntrack entry) the same.
func (s *scenario) ctAsk(local, remote netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 300*time.Millisecond)
	defer cancel()
	return s.topo.Client.AskUDP(ctx, local, remote)
}

// ctPin finds a source port, counting up from first, whose flow to remote is
// answered by pod, and checks that the flow stays with it.
func (s *scenario) ctPin(first uint16, remote netip.AddrPort, pod *netns.Pod) netip.AddrPort {
	s.t.Helper()
	for port := first; port < first+32; port++ {
		local := netip.AddrPortFrom(netns.ClientAddr, port)
		name, err := s.ctAsk(local, remote)
		if err != nil {
			s.t.Fatalf("ask %s from %s: %v", remote, local, err)
		}
		if name != pod.Name {
			continue
		}
		for range 5 {
			time.Sleep(ctInterval)
			if name, err := s.ctAsk(local, remote); err != nil || name != pod.Name {
				s.t.Fatalf("flow %s -> %s is pinned to %s, then answered %q, %v", local, remote, pod.Name, name, err)
			}
		}
		return local
	}
	s.t.Fatalf("32 source ports to %s, none answered by %s", remote, pod.Name)
	return netip.AddrPort{}
}

// ctFlow is one UDP client of a scenario: a fixed source and a destination.
type ctFlow struct {
	what          string // for messages: "ClusterIP", "NodePort", ...
	local, remote netip.AddrPort
}

// ctWatch sends from every flow each interval for up to d and returns, per
// flow, the answers (pod names, or "error: ..." ) in order. It stops early
// when done says every flow got what it waits for.
func (s *scenario) ctWatch(flows []ctFlow, d time.Duration, done func(last []string) bool) [][]string {
	s.t.Helper()
	answers := make([][]string, len(flows))
	last := make([]string, len(flows))
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(ctInterval) {
		for i, f := range flows {
			name, err := s.ctAsk(f.local, f.remote)
			if err != nil {
				name = "error: " + netns.Outcome(err)
			}
			answers[i] = append(answers[i], name)
			last[i] = name
		}
		if done != nil && done(last) {
			break
		}
	}
	return answers
}

// ctMetrics reads the daemon's /metrics from inside the node namespace,
// where it listens on loopback.
func (s *scenario) ctMetrics() prom.Families {
	s.t.Helper()
	fams, err := prom.Scrape(s.ctx, s.topo.Node, "127.0.0.1:10249")
	if err != nil {
		s.t.Fatalf("get metrics: %v", err)
	}
	return fams
}

// ctReconcilerStats are the two conntrack metrics: stale entries deleted,
// and reconcile calls with the time they took.
type ctReconcilerStats struct {
	deleted    float64
	reconciles uint64
	seconds    float64
}

func (s *scenario) ctStats() ctReconcilerStats {
	s.t.Helper()
	fams := s.ctMetrics()
	var st ctReconcilerStats
	// By ip_family, as kube-proxy: the deletions of both families; each
	// reconcile is observed in both, so one family counts them.
	del, ok := fams["kubeproxy_conntrack_reconciler_deleted_entries_total"]
	if !ok || len(del.Metric) != 2 {
		s.t.Fatalf("kubeproxy_conntrack_reconciler_deleted_entries_total missing from /metrics")
	}
	for _, series := range del.Metric {
		st.deleted += series.GetCounter().GetValue()
	}
	dur := prom.Series(fams["kubeproxy_conntrack_reconciler_sync_duration_seconds"], "ip_family", "IPv4")
	if dur == nil {
		s.t.Fatalf("kubeproxy_conntrack_reconciler_sync_duration_seconds missing from /metrics")
	}
	h := dur.GetHistogram()
	st.reconciles, st.seconds = h.GetSampleCount(), h.GetSampleSum()
	return st
}

// ctWaitReconciled waits until every sync logged so far was followed by its
// conntrack reconcile (the proxier logs "Synced" first, then reconciles).
// Without the reconciler (on false) it only reads the metrics.
func (s *scenario) ctWaitReconciled(on bool) ctReconcilerStats {
	s.t.Helper()
	for {
		if !on {
			return s.ctStats()
		}
		st := s.ctStats()
		if st.reconciles >= uint64(s.d.Syncs()) {
			return st
		}
		select {
		case <-s.ctx.Done():
			s.t.Fatalf("%d syncs but %d conntrack reconciles", s.d.Syncs(), st.reconciles)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ctArgs are the daemon's extra flags with or without the reconciler.
func ctArgs(reconciler bool) []string {
	if reconciler {
		return nil
	}
	return []string{"--conntrack=false"}
}

func ctDNS(endpoints ...*netns.Pod) string {
	sp := svcSpec{name: "dns", clusterIP: ctDNSVIP, proto: "UDP", port: 53, nodePort: ctDNSNodePort}
	for _, p := range endpoints {
		sp.endpoints = append(sp.endpoints, p.Addr.String())
	}
	return sp.yaml()
}

func TestConntrackUDPFollowsRemovedEndpoint(t *testing.T) {
	// With the reconciler the flows pinned to the removed pod are answered
	// by the other one within ctSwitchWithin; without it they stay with the
	// removed pod (its server still runs) for ctStuckFor.
	tests := []struct {
		name       string
		reconciler bool // false: run the daemon with --conntrack=false
	}{
		{name: "reconciler", reconciler: true},
		{name: "conntrack=false", reconciler: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScenario(t, 2, nil, ctArgs(tt.reconciler)...)
			gone, stays := s.topo.Pods[0], s.topo.Pods[1]
			s.change(func() { s.write("dns.yaml", ctDNS(gone, stays)) })
			vip := netip.AddrPortFrom(netip.MustParseAddr(ctDNSVIP), 53)
			np := netip.AddrPortFrom(netns.NodeAddr, ctDNSNodePort)
			flows := []ctFlow{
				{what: "ClusterIP", local: s.ctPin(41000, vip, gone), remote: vip},
				{what: "NodePort", local: s.ctPin(42000, np, gone), remote: np},
			}
			before := s.ctWaitReconciled(tt.reconciler)

			s.change(func() { s.write("dns.yaml", ctDNS(stays)) })
			synced := time.Now()
			if !tt.reconciler {
				answers := s.ctWatch(flows, ctStuckFor, nil)
				for i, f := range flows {
					for _, a := range answers[i] {
						if a != gone.Name {
							t.Errorf("%s flow %s without the reconciler: answers %v, want all from %s (the flow keeps its DNAT)",
								f.what, f.local, answers[i], gone.Name)
							break
						}
					}
				}
				if st := s.ctStats(); st.reconciles != 0 || st.deleted != 0 {
					t.Errorf("with --conntrack=false: %+v, want no reconcile", st)
				}
				return
			}
			answers := s.ctWatch(flows, ctSwitchWithin, func(last []string) bool {
				for _, a := range last {
					if a != stays.Name {
						return false
					}
				}
				return true
			})
			took := time.Since(synced)
			for i, f := range flows {
				got := answers[i]
				if got[len(got)-1] != stays.Name {
					t.Errorf("%s flow %s: %s after the sync that removed %s, answers %v, want %s",
						f.what, f.local, took.Round(time.Millisecond), gone.Name, got, stays.Name)
				}
			}
			t.Logf("flows answered by %s %s after the sync: %v", stays.Name, took.Round(time.Millisecond), answers)
			after := s.ctWaitReconciled(tt.reconciler)
			if d := after.deleted - before.deleted; d != float64(len(flows)) {
				t.Errorf("kubeproxy_conntrack_reconciler_deleted_entries_total grew by %v, want %d (the pinned flows)", d, len(flows))
			}
			if after.reconciles <= before.reconciles || after.seconds <= 0 {
				t.Errorf("kubeproxy_conntrack_reconciler_sync_duration_seconds: %+v then %+v, want another observation", before, after)
			}
			t.Logf("reconciler: %+v", after)
		})
	}
}

func TestConntrackUDPFirstEndpoint(t *testing.T) {
	tests := []struct {
		name       string
		reconciler bool // false: run the daemon with --conntrack=false
		// wantAnswered says, per flow, whether it must be answered within
		// ctSwitchWithin of the sync that added the endpoints.
		wantAnswered []bool
	}{
		// A refused datagram to a service without endpoints leaves no
		// conntrack entry (it is rejected before the entry is confirmed),
		// so the first two flows need no reconciler. The third, to a
		// NodePort no service had, was delivered locally and refused by the
		// node's own stack: its entry (not DNATed) stays and only the
		// reconciler can remove it.
		{name: "reconciler", reconciler: true, wantAnswered: []bool{true, true, true}},
		{name: "conntrack=false", reconciler: false, wantAnswered: []bool{true, true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const newNodePort = 30054
			s := newScenario(t, 1, nil, ctArgs(tt.reconciler)...)
			pod := s.topo.Pods[0]
			s.change(func() { s.write("dns.yaml", ctDNS()) })
			flows := []ctFlow{
				{what: "ClusterIP without endpoints", local: netip.AddrPortFrom(netns.ClientAddr, 43000),
					remote: netip.AddrPortFrom(netip.MustParseAddr(ctDNSVIP), 53)},
				{what: "NodePort without endpoints", local: netip.AddrPortFrom(netns.ClientAddr, 43001),
					remote: netip.AddrPortFrom(netns.NodeAddr, ctDNSNodePort)},
				{what: "NodePort of no service", local: netip.AddrPortFrom(netns.ClientAddr, 43002),
					remote: netip.AddrPortFrom(netns.NodeAddr, newNodePort)},
			}
			for _, f := range flows {
				for range 3 {
					if _, err := s.ctAsk(f.local, f.remote); !errors.Is(err, syscall.ECONNREFUSED) {
						t.Fatalf("%s %s from %s: %v, want refused", f.what, f.remote, f.local, err)
					}
					time.Sleep(ctInterval)
				}
			}
			before := s.ctWaitReconciled(tt.reconciler)

			s.change(func() {
				s.write("dns.yaml", ctDNS(pod))
				s.write("new.yaml", svcSpec{name: "new", clusterIP: "10.96.0.54", proto: "UDP", port: 53,
					nodePort: newNodePort, endpoints: []string{pod.Addr.String()}}.yaml())
			})
			synced := time.Now()
			// A flow expected to stay refused is watched for ctStuckFor;
			// otherwise watching ends once every flow is answered.
			watch, done := ctSwitchWithin, func(last []string) bool {
				for _, a := range last {
					if a != pod.Name {
						return false
					}
				}
				return true
			}
			if slices.Contains(tt.wantAnswered, false) {
				watch, done = ctStuckFor, nil
			}
			answers := s.ctWatch(flows, watch, done)
			took := time.Since(synced)
			for i, f := range flows {
				got := answers[i]
				if tt.wantAnswered[i] && got[len(got)-1] != pod.Name {
					t.Errorf("%s from %s: %s after the sync that added %s, answers %v, want %s",
						f.what, f.local, took.Round(time.Millisecond), pod.Name, got, pod.Name)
				}
				if !tt.wantAnswered[i] && slices.ContainsFunc(got, func(a string) bool { return a != "error: refused" }) {
					t.Errorf("%s from %s without the reconciler: answers %v, want it refused throughout (else the test would not notice a reconciler doing nothing)",
						f.what, f.local, got)
				}
			}
			t.Logf("answers %s after the sync: %v", took.Round(time.Millisecond), answers)
			after := s.ctWaitReconciled(tt.reconciler)
			if tt.reconciler && after.deleted-before.deleted != 1 {
				t.Errorf("kubeproxy_conntrack_reconciler_deleted_entries_total grew by %v, want 1 (the NodePort flow refused locally)",
					after.deleted-before.deleted)
			}
		})
	}
}

func TestConntrackTCPIsNotDeleted(t *testing.T) {
	s := newScenario(t, 2, nil)
	web := func(pods ...*netns.Pod) string {
		sp := svcSpec{name: "web", clusterIP: "10.96.0.80", port: 80}
		for _, p := range pods {
			sp.endpoints = append(sp.endpoints, p.Addr.String())
		}
		return sp.yaml()
	}
	s.change(func() { s.write("web.yaml", web(s.topo.Pods...)) })
	vip := netip.MustParseAddrPort("10.96.0.80:80")
	sessions := map[string]*netns.TCPSession{} // by pod name
	for port := uint16(44000); len(sessions) < 2 && port < 44032; port++ {
		sess, err := s.topo.Client.ConnectTCP(s.ctx, netip.AddrPortFrom(netns.ClientAddr, port), vip)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sess.Close() })
		if _, ok := sessions[sess.Name]; ok {
			sess.Close()
			continue
		}
		sessions[sess.Name] = sess
	}
	gone, stays := s.topo.Pods[0], s.topo.Pods[1]
	if len(sessions) != 2 {
		t.Fatalf("32 connections reached only %v", sessions)
	}
	before := s.ctWaitReconciled(true)

	s.change(func() { s.write("web.yaml", web(stays)) })
	after := s.ctWaitReconciled(true)
	if after.reconciles <= before.reconciles || after.deleted != before.deleted {
		t.Errorf("reconciler metrics %+v then %+v, want a reconcile that deleted nothing", before, after)
	}
	if name, err := s.topo.Client.AskTCP(s.ctx, vip); err != nil || name != stays.Name {
		t.Errorf("new connection after removing %s: %q, %v; want %s", gone.Name, name, err, stays.Name)
	}
	for name, sess := range sessions {
		ctx, cancel := context.WithTimeout(s.ctx, 500*time.Millisecond)
		got, err := sess.Echo(ctx, "still there?")
		cancel()
		if err != nil || got != "still there?" {
			t.Errorf("established connection to %s after removing %s: %q, %v; want it untouched", name, gone.Name, got, err)
		}
	}

	// The echo check above would notice a deleted entry: delete the one of
	// the connection to the removed pod by hand, and that connection breaks.
	ctConn, err := conntrack.Dial(s.topo.Node.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer ctConn.Close()
	flows, err := ctConn.Dump(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	sess := sessions[gone.Name]
	var found bool
	for _, f := range flows {
		if f.Proto == syscall.IPPROTO_TCP && f.OrigSrc == netip.MustParseAddrPort(sess.Conn.LocalAddr().String()) {
			found = true
			if err := ctConn.Delete(s.ctx, f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !found {
		t.Fatalf("no conntrack entry for %s -> %s in the node namespace: %v", sess.Conn.LocalAddr(), vip, flows)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 500*time.Millisecond)
	defer cancel()
	if got, err := sess.Echo(ctx, "still there?"); err == nil {
		t.Errorf("connection to %s answered %q after its conntrack entry was deleted; the check above proves nothing", gone.Name, got)
	}
}
