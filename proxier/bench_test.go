package proxier_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// The user-space share of a sync at the sizes the targets name
// (kernel time is measured by cmd/bench): run with
//
//	go test -run - -bench . -benchmem ./proxier/

var benchConfig = proxier.Config{
	Family:       m.IPv4,
	ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
}

// benchSizes are the service counts of the targets.
var benchSizes = []int{10000, 50000}

// benchSnapshot holds n TCP services with three ready endpoints each, one in
// twenty with a NodePort: the shape cmd/bench loads into the kernel.
func benchSnapshot(n int) *k8s.Snapshot {
	snap := &k8s.Snapshot{Services: make([]k8s.ServicePort, n), Node: k8s.Node{Name: "node-1"}}
	for i := range n {
		snap.Services[i] = benchService(i)
	}
	return snap
}

func benchService(i int) k8s.ServicePort {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: fmt.Sprintf("svc-%05d", i), Port: "http", Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})},
		Port:       80,
	}
	if i%20 == 0 {
		sp.NodePort = uint16(30000 + i/20)
	}
	for j := range 3 {
		sp.Endpoints = append(sp.Endpoints, benchEndpoint(uint32(3*i+j+1)))
	}
	return sp
}

// benchEndpoint returns the n-th address of 10.128.0.0/10, port 8080.
func benchEndpoint(n uint32) k8s.Endpoint {
	v := uint32(10)<<24 | 128<<16 + n
	return k8s.Endpoint{Addr: netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}),
		Port: 8080, Ready: true, Serving: true}
}

// withEndpointChanged returns a copy of snap where the last endpoint of
// service i has another address (the endpoint count stays three).
func withEndpointChanged(snap *k8s.Snapshot, i int, to uint32) *k8s.Snapshot {
	next := &k8s.Snapshot{Services: append([]k8s.ServicePort(nil), snap.Services...), Node: snap.Node}
	eps := append([]k8s.Endpoint(nil), next.Services[i].Endpoints...)
	eps[2] = benchEndpoint(to)
	next.Services[i].Endpoints = eps
	return next
}

// withServiceAdded returns a copy of snap with one more service, kept in
// name order.
func withServiceAdded(snap *k8s.Snapshot) *k8s.Snapshot {
	next := &k8s.Snapshot{Services: append(snap.Services[:len(snap.Services):len(snap.Services)],
		benchService(len(snap.Services))), Node: snap.Node}
	return next
}

func BenchmarkCompile(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			snap := benchSnapshot(n)
			b.ReportAllocs()
			for b.Loop() {
				proxier.Compile(snap, benchConfig)
			}
		})
	}
}

// BenchmarkDiff diffs two compiled rulesets: one endpoint of one service
// changed, or one service added.
func BenchmarkDiff(b *testing.B) {
	for _, n := range benchSizes {
		snap := benchSnapshot(n)
		applied := proxier.Compile(snap, benchConfig)
		cases := []struct {
			name string
			next *k8s.Snapshot
		}{
			{"endpoint-changed", withEndpointChanged(snap, n/2, 1<<20)},
			{"service-added", withServiceAdded(snap)},
			{"unchanged", snap},
		}
		for _, c := range cases {
			desired := proxier.Compile(c.next, benchConfig)
			b.Run(fmt.Sprintf("%s/services=%d", c.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, ok := m.Diff(applied, desired); !ok {
						b.Fatal("diff not expressible incrementally")
					}
				}
			})
		}
	}
}

// BenchmarkSync is the user-space share of the daemon's sync of one change
// with n services applied: Proxier.SyncChanges, given the changed service
// port as the tracker hands it over, with a kernel that takes the changes and
// does nothing. Each iteration flips between two states, so every sync
// carries a real change: one endpoint of one service changed, or one service
// added (and, flipping back, removed).
func BenchmarkSync(b *testing.B) {
	for _, n := range benchSizes {
		snap := benchSnapshot(n)
		changed := withEndpointChanged(snap, n/2, 1<<20)
		added := withServiceAdded(snap)
		cases := []struct {
			name   string
			states [2]k8s.Changes
		}{
			{"endpoint-changed", [2]k8s.Changes{portChanged(changed, n/2), portChanged(snap, n/2)}},
			{"service-added", [2]k8s.Changes{portChanged(added, n), portGone(snap, added.Services[n].Name)}},
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("%s/services=%d", c.name, n), func(b *testing.B) {
				var k nopKernel
				p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: &k})
				if err := p.Sync(context.Background(), snap, true); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := p.SyncChanges(context.Background(), c.states[i%2]); err != nil {
						b.Fatal(err)
					}
					i++
				}
				if k.deltas != i || k.full != 1 {
					b.Fatalf("%d deltas and %d full syncs for %d changes; want a delta each", k.deltas, k.full, i)
				}
			})
		}
	}
}

// portChanged is what the tracker hands over when service port i of snap
// changed.
func portChanged(snap *k8s.Snapshot, i int) k8s.Changes {
	return k8s.Changes{Ports: map[k8s.ServicePortName]*k8s.ServicePort{snap.Services[i].Name: &snap.Services[i]},
		Node: snap.Node, ServiceCIDRs: snap.ServiceCIDRs}
}

// portGone is what the tracker hands over when a service port of snap went.
func portGone(snap *k8s.Snapshot, name k8s.ServicePortName) k8s.Changes {
	return k8s.Changes{Ports: map[k8s.ServicePortName]*k8s.ServicePort{name: nil},
		Node: snap.Node, ServiceCIDRs: snap.ServiceCIDRs}
}

// nopKernel counts what it is asked to apply.
type nopKernel struct{ full, deltas int }

func (k *nopKernel) Apply(*m.Ruleset) (m.Stats, error) { k.full++; return m.Stats{}, nil }
func (k *nopKernel) Generation() (uint32, error)       { return 0, nil }
func (k *nopKernel) ApplyChanges(m.Family, string, *m.Changes) (m.Stats, error) {
	k.deltas++
	return m.Stats{}, nil
}

// wideSnapshot is one TCP service port with n endpoints.
func wideSnapshot(n int) *k8s.Snapshot {
	sp := k8s.ServicePort{
		Name:       k8s.ServicePortName{Namespace: "default", Name: "wide", Port: "http", Protocol: k8s.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Port:       80,
	}
	for j := range n {
		sp.Endpoints = append(sp.Endpoints, benchEndpoint(uint32(j+1)))
	}
	return &k8s.Snapshot{Services: []k8s.ServicePort{sp}, Node: k8s.Node{Name: "node-1"}}
}

// zipfSnapshot holds n TCP services whose endpoint counts follow cmd/bench's
// zipf10k workload: P(k) ∝ k^-2 for k in 1..5000, the same seed.
func zipfSnapshot(n int) *k8s.Snapshot {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 1)), 2, 1, 4999)
	snap := &k8s.Snapshot{Services: make([]k8s.ServicePort, n), Node: k8s.Node{Name: "node-1"}}
	next := uint32(1)
	for i := range n {
		sp := benchService(i)
		sp.Endpoints = nil
		for range int(z.Uint64()) + 1 {
			sp.Endpoints = append(sp.Endpoints, benchEndpoint(next))
			next++
		}
		snap.Services[i] = sp
	}
	return snap
}

// widest is the index of the service port with the most endpoints.
func widest(snap *k8s.Snapshot) int {
	at := 0
	for i := range snap.Services {
		if len(snap.Services[i].Endpoints) > len(snap.Services[at].Endpoints) {
			at = i
		}
	}
	return at
}

// withWide returns snap with its one service port changed by mod.
func withWide(snap *k8s.Snapshot, mod func(*k8s.ServicePort)) *k8s.Snapshot {
	sp := snap.Services[0]
	sp.Endpoints = append([]k8s.Endpoint(nil), sp.Endpoints...)
	mod(&sp)
	return &k8s.Snapshot{Services: []k8s.ServicePort{sp}, Node: snap.Node}
}

// wideLocalPolicy gives the service a NodePort with externalTrafficPolicy
// Local and puts every other endpoint on this node.
func wideLocalPolicy(sp *k8s.ServicePort) {
	sp.NodePort = 30080
	sp.ExternalPolicyLocal = true
	for j := range sp.Endpoints {
		if sp.Endpoints[j].Addr.As4()[3]%2 == 0 {
			sp.Endpoints[j].NodeName = "node-1"
		}
	}
}

// wideAffinity gives the service ClientIP session affinity.
func wideAffinity(sp *k8s.ServicePort) { sp.AffinityTimeout = 3 * time.Hour }

// withWideEndpointReplaced replaces endpoint i of the one service by
// address number to (kept sorted: to is past every other).
func withWideEndpointReplaced(snap *k8s.Snapshot, i int, to uint32) *k8s.Snapshot {
	sp := snap.Services[0]
	sp.Endpoints = append(append(append([]k8s.Endpoint(nil), sp.Endpoints[:i]...), sp.Endpoints[i+1:]...), benchEndpoint(to))
	return &k8s.Snapshot{Services: []k8s.ServicePort{sp}, Node: snap.Node}
}

// BenchmarkKernelSync is Proxier.Sync through netlink into a fresh network
// namespace (root only): a first full sync, and a delta sync of one endpoint
// replaced, flipping between two snapshots. The same 5,000 endpoints behind
// one service and spread over 1,666 services, and 10,000 services of three.
//
//	go test -run - -bench KernelSync ./proxier/
func BenchmarkKernelSync(b *testing.B) {
	workloads := []struct {
		name       string
		snap, next *k8s.Snapshot
	}{
		{name: "1x5000"},
		{name: "1666x3"},
		{name: "10000x3"},
		{name: "1x5000-etp-local"},
		{name: "1x5000-affinity"},
		{name: "zipf10k"},
		{name: "10x1000"},
	}
	workloads[0].snap = wideSnapshot(5000)
	workloads[0].next = withWideEndpointReplaced(workloads[0].snap, 2500, 1<<20)
	workloads[3].snap = withWide(wideSnapshot(5000), wideLocalPolicy)
	// A remote endpoint replaced by a remote one (odd addresses are on
	// other nodes): the local count stays, as the endpoint count does.
	workloads[3].next = withWide(withWideEndpointReplaced(workloads[0].snap, 2500, 1<<20+1), wideLocalPolicy)
	workloads[4].snap = withWide(wideSnapshot(5000), wideAffinity)
	workloads[4].next = withWide(withWideEndpointReplaced(workloads[0].snap, 2500, 1<<20), wideAffinity)
	workloads[1].snap = benchSnapshot(1666)
	workloads[1].next = withEndpointChanged(workloads[1].snap, 833, 1<<20)
	workloads[2].snap = benchSnapshot(10000)
	workloads[2].next = withEndpointChanged(workloads[2].snap, 5000, 1<<20)
	workloads[5].snap = zipfSnapshot(10000)
	workloads[5].next = withEndpointChanged(workloads[5].snap, widest(workloads[5].snap), 1<<22)
	workloads[6].snap = zipfSnapshot(0)
	for i := range 10 {
		sp := benchService(i)
		sp.Endpoints = nil
		for j := range 1000 {
			sp.Endpoints = append(sp.Endpoints, benchEndpoint(uint32(1000*i+j+1)))
		}
		workloads[6].snap.Services = append(workloads[6].snap.Services, sp)
	}
	workloads[6].next = withEndpointChanged(workloads[6].snap, 5, 1<<22)
	for _, w := range workloads {
		b.Run("full/"+w.name, func(b *testing.B) {
			ns := netns.New(b, "pxb")
			conn, err := nftnl.Dial(ns.Fd())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			var meter cpuMeter
			for b.Loop() {
				b.StopTimer()
				if err := nftnl.Delete(conn, m.IPv4, proxier.TableName); err != nil {
					b.Fatal(err)
				}
				p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: nftnl.Kernel{Conn: conn}})
				b.StartTimer()
				meter.start()
				if err := p.Sync(context.Background(), w.snap, true); err != nil {
					b.Fatal(err)
				}
				meter.stop()
			}
			meter.report(b)
			rs := proxier.Compile(w.snap, benchConfig)
			b.ReportMetric(float64(len(rs.Chains)), "chains")
			b.ReportMetric(float64(len(rs.Sets)), "sets+maps")
		})
		b.Run("endpoint-replaced/"+w.name, func(b *testing.B) {
			ns := netns.New(b, "pxb")
			conn, err := nftnl.Dial(ns.Fd())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: nftnl.Kernel{Conn: conn}})
			if err := p.Sync(context.Background(), w.snap, true); err != nil {
				b.Fatal(err)
			}
			snaps := [2]*k8s.Snapshot{w.next, w.snap}
			i := 0
			var meter cpuMeter
			meter.start()
			for b.Loop() {
				if err := p.Sync(context.Background(), snaps[i%2], false); err != nil {
					b.Fatal(err)
				}
				i++
			}
			meter.stop()
			meter.report(b)
		})
	}
}

// cpuMeter adds up the CPU time the process uses between start and stop,
// user and system: on a machine whose cores other work shares, a steadier
// figure than wall time (the kernel's commit work runs mostly in the syncing
// thread's system call). The system share is mostly the kernel building what
// the batch asks for.
type cpuMeter struct {
	cpu, sys     time.Duration
	cpuAt, sysAt time.Duration
}

func (m *cpuMeter) start() { m.cpuAt, m.sysAt = cpuTimes() }

func (m *cpuMeter) stop() {
	cpu, sys := cpuTimes()
	m.cpu += cpu - m.cpuAt
	m.sys += sys - m.sysAt
}

// report gives the time per iteration as cpu-ms/op and sys-ms/op.
func (m *cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(m.cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(m.sys.Microseconds())/1000/float64(b.N), "sys-ms/op")
}

// cpuTimes is the CPU time the process has used, user and system, and the
// system share alone.
func cpuTimes() (cpu, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}

// stagedKernel calls at before each full apply, with the model in hand.
type stagedKernel struct {
	nftnl.Kernel
	at func()
}

func (k stagedKernel) Apply(rs *m.Ruleset) (m.Stats, error) {
	k.at()
	return k.Kernel.Apply(rs)
}

// liveMiB is the heap a collection leaves.
func liveMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// BenchmarkFirstSyncMemory prints what a daemon's first full sync holds
// beside the snapshot (root only: the batch goes into a fresh namespace):
// snapshot-MiB is the snapshot's live heap, model-MiB what is live on top
// of it when the model goes to the kernel (the model and the state the
// proxier keeps), kept-MiB what the proxier keeps after the sync, and
// alloc-MiB all the sync allocated. The collections between the stages
// are not timed, and the figures are one sync's, whatever b.N.
//
//	go test -run - -bench FirstSyncMemory -benchtime 1x ./proxier/
func BenchmarkFirstSyncMemory(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := netns.New(b, "pxm")
			conn, err := nftnl.Dial(ns.Fd())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			snap := benchSnapshot(n)
			var base, model, kept, alloc float64
			for b.Loop() {
				b.StopTimer()
				if err := nftnl.Delete(conn, m.IPv4, proxier.TableName); err != nil {
					b.Fatal(err)
				}
				base = liveMiB()
				k := stagedKernel{Kernel: nftnl.Kernel{Conn: conn}, at: func() { model = liveMiB() - base }}
				p := proxier.New(proxier.Options{Configs: []proxier.Config{benchConfig}, Kernel: k})
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b.StartTimer()
				if err := p.Sync(context.Background(), snap, true); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				runtime.ReadMemStats(&after)
				alloc = float64(after.TotalAlloc-before.TotalAlloc) / (1 << 20)
				kept = liveMiB() - base
				runtime.KeepAlive(p)
				b.StartTimer()
			}
			b.ReportMetric(base, "snapshot-MiB")
			b.ReportMetric(model, "model-MiB")
			b.ReportMetric(kept, "kept-MiB")
			b.ReportMetric(alloc, "alloc-MiB")
		})
	}
}
