package e2e

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// SCTP through nftproxy's DNAT with real packets. This kernel has SCTP
// conntrack and NAT but no SCTP sockets (no sctp module), so the client
// sends raw INIT chunks with a correct CRC32c from its namespace, and a
// sniffer (packet socket) in each pod namespace looks for them: an INIT
// that arrives addressed to the pod's address and target port, with a
// checksum that is still right, went through the ClusterIP or NodePort DNAT
// (NAT rewrites the ports and the CRC32c; conntrack would call a bad CRC
// invalid, and the forward chain drops those).

const (
	sctpVIP      = "10.96.0.30"
	sctpPort     = 3868 // Diameter
	sctpNodePort = 30868
)

func sctpService(endpoints ...*netns.Pod) string {
	sp := svcSpec{name: "diameter", clusterIP: sctpVIP, proto: "SCTP", port: sctpPort, targetPort: sctpPort, nodePort: sctpNodePort}
	for _, p := range endpoints {
		sp.endpoints = append(sp.endpoints, p.Addr.String())
	}
	return sp.yaml()
}

// sctpInit sends a raw INIT from the client's srcPort to dst and returns the
// pod that received it DNATed to its address and the service's target port
// (nil when none did within a second).
func (s *scenario) sctpInit(dst netip.AddrPort, srcPort uint16, tag uint32) *netns.Pod {
	s.t.Helper()
	mac, err := s.topo.Node.MAC(netns.NodeUplink)
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, time.Second)
	defer cancel()
	var (
		mu  sync.Mutex
		got *netns.Pod
		wg  sync.WaitGroup
	)
	for _, p := range s.topo.Pods {
		sn, err := p.NS.Sniff(netns.PodIface)
		if err != nil {
			s.t.Fatal(err)
		}
		wg.Go(func() {
			defer sn.Close()
			want := netip.AddrPortFrom(p.Addr, sctpPort)
			found, err := sn.Wait(ctx, func(ip []byte) bool {
				init, ok := netns.ParseSCTPInit(ip)
				if !ok || init.Tag != tag || init.Dst != want {
					return false
				}
				if !init.ChecksumOK {
					s.t.Errorf("INIT %#x reached %s with a wrong CRC32c: NAT did not recompute it", tag, p.Name)
				}
				return true
			})
			if err != nil {
				s.t.Error(err)
			}
			if found {
				mu.Lock()
				got = p
				mu.Unlock()
				cancel()
			}
		})
	}
	err = s.topo.Client.SendRaw(netns.RawFrame{Dev: netns.PodIface, DstMAC: net.HardwareAddr(mac), Proto: 132,
		Src: netns.ClientAddr, Dst: dst.Addr(), Payload: netns.SCTPInit(srcPort, dst.Port(), tag)})
	if err != nil {
		s.t.Fatal(err)
	}
	wg.Wait()
	return got
}

func podName(p *netns.Pod) string {
	if p == nil {
		return "no pod"
	}
	return p.Name
}

// sctpFlows are the node's SCTP conntrack entries to dst DNATed to ep.
func (s *scenario) sctpFlows(dst netip.AddrPort, ep netip.AddrPort) int {
	s.t.Helper()
	ct, err := conntrack.Dial(s.topo.Node.Fd())
	if err != nil {
		s.t.Fatal(err)
	}
	defer ct.Close()
	flows, err := ct.Dump(s.ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Proto == 132 && f.OrigDst == dst && f.ReplySrc == ep {
			n++
		}
	}
	return n
}

// TestSCTPThroughDNAT: INITs to the ClusterIP and the NodePort reach the
// endpoint DNATed; when the endpoint is replaced, the reconciler deletes the
// SCTP flows DNATed to it and the same INITs reach the new endpoint. With
// --conntrack=false the flows stay and the INITs keep reaching the old pod,
// which shows the test would catch a reconciler that skipped SCTP.
func TestSCTPThroughDNAT(t *testing.T) {
	for _, reconciler := range []bool{true, false} {
		name := "reconciler"
		if !reconciler {
			name = "conntrack=false"
		}
		t.Run(name, func(t *testing.T) {
			s := newScenario(t, 2, nil, ctArgs(reconciler)...)
			// An unanswered INIT's entry lives 3 s by default (COOKIE_WAIT):
			// longer here, so that only a deletion removes it during the test.
			if err := s.topo.Node.Sysctl("net/netfilter/nf_conntrack_sctp_timeout_cookie_wait", "120"); err != nil {
				t.Fatal(err)
			}
			gone, stays := s.topo.Pods[0], s.topo.Pods[1]
			s.change(func() { s.write("diameter.yaml", sctpService(gone)) })
			vip := netip.AddrPortFrom(netip.MustParseAddr(sctpVIP), sctpPort)
			np := netip.AddrPortFrom(netns.NodeAddr, sctpNodePort)
			flows := []struct {
				what string
				dst  netip.AddrPort
				src  uint16
				tag  uint32
			}{
				{"ClusterIP", vip, 43000, 0x5c7a0001},
				{"NodePort", np, 43001, 0x5c7a0002},
			}
			for _, f := range flows {
				if got := s.sctpInit(f.dst, f.src, f.tag); got != gone {
					t.Fatalf("%s INIT to %s reached %s, want %s", f.what, f.dst, podName(got), gone.Name)
				}
				if n := s.sctpFlows(f.dst, netip.AddrPortFrom(gone.Addr, sctpPort)); n != 1 {
					t.Fatalf("%s: %d SCTP conntrack entries DNATed to %s, want 1", f.what, n, gone.Name)
				}
			}
			before := s.ctWaitReconciled(reconciler)

			s.change(func() { s.write("diameter.yaml", sctpService(stays)) })
			after := s.ctWaitReconciled(reconciler)
			want, wantFlows := stays, 0
			if !reconciler {
				want, wantFlows = gone, 1
			}
			for _, f := range flows {
				if n := s.sctpFlows(f.dst, netip.AddrPortFrom(gone.Addr, sctpPort)); n != wantFlows {
					t.Errorf("%s after %s was replaced: %d SCTP entries DNATed to it, want %d", f.what, gone.Name, n, wantFlows)
				}
				if got := s.sctpInit(f.dst, f.src, f.tag); got != want {
					t.Errorf("%s INIT from the same port after %s was replaced reached %s, want %s", f.what, gone.Name, podName(got), want.Name)
				}
			}
			if d := after.deleted - before.deleted; reconciler && d != float64(len(flows)) {
				t.Errorf("kubeproxy_conntrack_reconciler_deleted_entries_total grew by %v, want %d", d, len(flows))
			}
		})
	}
}

// sctpSocket opens an SCTP socket in ns (the kernel loads its sctp module
// on demand where it has one), or says why it can't.
func sctpSocket(ns *netns.NS) (int, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		return err
	})
	return fd, err
}

// TestSCTPAssociation: where the kernel has SCTP sockets, a real
// association through the ClusterIP and the NodePort reaches the endpoint,
// which answers with its name. Skipped where it hasn't (as here: the raw
// INITs of TestSCTPThroughDNAT cover that kernel).
func TestSCTPAssociation(t *testing.T) {
	s := newScenario(t, 1, nil)
	pod := s.topo.Pods[0]
	lfd, err := sctpSocket(pod.NS)
	if err != nil {
		t.Skipf("no SCTP sockets in this kernel (%v); TestSCTPThroughDNAT sends raw INITs instead", err)
	}
	defer unix.Close(lfd)
	a := pod.Addr.As4()
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: sctpPort, Addr: a}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 8); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, _, err := unix.Accept(lfd)
			if err != nil {
				return
			}
			_, _ = unix.Write(c, []byte(pod.Name))
			_ = unix.Close(c)
		}
	}()
	s.change(func() { s.write("diameter.yaml", sctpService(pod)) })
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(netip.MustParseAddr(sctpVIP), sctpPort),
		netip.AddrPortFrom(netns.NodeAddr, sctpNodePort),
	} {
		fd, err := sctpSocket(s.topo.Client)
		if err != nil {
			t.Fatal(err)
		}
		tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		buf := make([]byte, 64)
		n := 0
		err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
		if err == nil {
			n, err = unix.Read(fd, buf)
		}
		_ = unix.Close(fd)
		if err != nil || string(buf[:max(n, 0)]) != pod.Name {
			t.Errorf("SCTP association to %s: read %q, %v; want %q", dst, buf[:max(n, 0)], err, pod.Name)
		}
	}
}
