package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultAskTimeout bounds AskTCP, AskUDP and ConnectTCP when the context has
// no deadline, so a dropped packet fails a test instead of hanging it.
const DefaultAskTimeout = 2 * time.Second

// ServeName starts a name server in the pod; Topology.Close stops it too.
// See NS.ServeName.
func (p *Pod) ServeName(proto string, port int) (stop func(), err error) {
	stop, err = p.NS.ServeName(p.Name, proto, port)
	if err != nil {
		return nil, err
	}
	p.servers.add(stop)
	return stop, nil
}

// PeerQuery is the line (TCP) or datagram (UDP) a name server answers with
// the client's address as it sees it (ip:port), so tests can tell preserved
// from masqueraded sources. See TCPSession.Peer and NS.AskUDPPeer.
const PeerQuery = "peer?"

// ServeName runs a server in the namespace on port of every address of both
// families. proto is "tcp" or "udp" (any case, so Kubernetes' "TCP" works).
// TCP: each connection gets name + "\n", then every line it sends is echoed
// back until it closes, so long-lived connections can be tested. UDP: each
// datagram is answered with name + "\n". PeerQuery (a TCP line or a UDP
// datagram) is answered with the client's address instead. stop closes the
// socket and every open connection and waits for the goroutines; calling it
// twice is safe.
func (n *NS) ServeName(name, proto string, port int) (stop func(), err error) {
	addr := fmt.Sprintf(":%d", port)
	switch strings.ToLower(proto) {
	case "tcp":
		l, err := n.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		return serveTCP(l, name), nil
	case "udp":
		c, err := n.ListenPacket("udp", addr)
		if err != nil {
			return nil, err
		}
		return serveUDP(c, name), nil
	default:
		return nil, fmt.Errorf("serve name: protocol %q, want tcp or udp", proto)
	}
}

// ServeTCP runs handle on every TCP connection to port in the pod, each on
// a goroutine of its own that closes the connection when handle returns,
// until Topology.Close: a server that answers in its own way.
func (p *Pod) ServeTCP(port int, handle func(net.Conn)) error {
	l, err := p.NS.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	p.servers.add(serveConns(l, handle))
	return nil
}

func serveTCP(l net.Listener, name string) func() {
	return serveConns(l, func(c net.Conn) {
		if _, err := fmt.Fprintf(c, "%s\n", name); err != nil {
			return
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			line := sc.Text()
			if line == PeerQuery {
				line = c.RemoteAddr().String()
			}
			if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
				return
			}
		}
	})
}

// serveConns runs handle on every connection l accepts. The stop it returns
// closes l and every open connection and waits for the goroutines; calling
// it twice is safe.
func serveConns(l net.Listener, handle func(net.Conn)) func() {
	var (
		mu     sync.Mutex
		conns  = map[net.Conn]struct{}{}
		closed bool
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // the listener was closed by stop
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c)
			})
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			closed = true
			l.Close()
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
}

func serveUDP(c net.PacketConn, name string) func() {
	var wg sync.WaitGroup
	wg.Go(func() {
		reply := []byte(name + "\n")
		buf := make([]byte, 64<<10)
		for {
			m, from, err := c.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue // e.g. an ICMP error for an earlier reply
			}
			if strings.TrimSuffix(string(buf[:m]), "\n") == PeerQuery {
				_, _ = c.WriteTo([]byte(from.String()+"\n"), from)
				continue
			}
			_, _ = c.WriteTo(reply, from)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			c.Close()
			wg.Wait()
		})
	}
}

// serverSet remembers a pod's servers so Topology.Close can stop them.
type serverSet struct {
	mu    sync.Mutex
	stops []func()
}

func (s *serverSet) add(stop func()) {
	s.mu.Lock()
	s.stops = append(s.stops, stop)
	s.mu.Unlock()
}

func (s *serverSet) stopAll() {
	s.mu.Lock()
	stops := s.stops
	s.stops = nil
	s.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// withDefaultTimeout gives ctx a deadline of DefaultAskTimeout if it has none.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultAskTimeout)
}

// AskTCP connects from the namespace to addr, returns the first line the
// server sends (a name server's name) and closes the connection. A refused
// connection fails at once with an error matching syscall.ECONNREFUSED; a
// silent drop fails when ctx (or DefaultAskTimeout) expires, see IsTimeout.
func (n *NS) AskTCP(ctx context.Context, addr netip.AddrPort) (string, error) {
	return n.AskTCPFrom(ctx, netip.AddrPort{}, addr)
}

// AskTCPFrom is AskTCP from a fixed local address and/or port (zero parts
// are chosen by the kernel).
func (n *NS) AskTCPFrom(ctx context.Context, local, remote netip.AddrPort) (string, error) {
	s, err := n.ConnectTCP(ctx, local, remote)
	if err != nil {
		return "", err
	}
	s.Close()
	return s.Name, nil
}

// TCPSession is an open connection to a name server, for tests of
// long-lived connections.
type TCPSession struct {
	Conn net.Conn
	// Name is the first line the server sent.
	Name string
	r    *bufio.Reader
}

// ConnectTCP connects like AskTCPFrom but keeps the connection open.
func (n *NS) ConnectTCP(ctx context.Context, local, remote netip.AddrPort) (*TCPSession, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	c, err := n.DialFrom(ctx, "tcp", addrPortString(local), remote.String())
	if err != nil {
		return nil, err
	}
	s := &TCPSession{Conn: c, r: bufio.NewReader(c)}
	line, err := s.readLine(ctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read name from %s: %w", remote, err)
	}
	s.Name = line
	return s, nil
}

// Echo sends line and returns what comes back (the name server echoes it).
func (s *TCPSession) Echo(ctx context.Context, line string) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := s.Conn.SetWriteDeadline(deadline(ctx)); err != nil {
		return "", fmt.Errorf("set write deadline: %w", err)
	}
	if _, err := fmt.Fprintf(s.Conn, "%s\n", line); err != nil {
		return "", fmt.Errorf("send line: %w", err)
	}
	got, err := s.readLine(ctx)
	if err != nil {
		return "", fmt.Errorf("read echo: %w", err)
	}
	return got, nil
}

// Peer asks the server for the client address it sees (PeerQuery).
func (s *TCPSession) Peer(ctx context.Context) (netip.AddrPort, error) {
	got, err := s.Echo(ctx, PeerQuery)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return parsePeer(got)
}

// Close closes the connection.
func (s *TCPSession) Close() error { return s.Conn.Close() }

func (s *TCPSession) readLine(ctx context.Context) (string, error) {
	if err := s.Conn.SetReadDeadline(deadline(ctx)); err != nil {
		return "", fmt.Errorf("set read deadline: %w", err)
	}
	line, err := s.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// AskUDP sends one datagram from the namespace to remote (from local when it
// is valid; zero parts are chosen by the kernel) and returns the answer
// without its trailing newline. The socket is connected, so an ICMP port
// unreachable surfaces as an error matching syscall.ECONNREFUSED.
func (n *NS) AskUDP(ctx context.Context, local, remote netip.AddrPort) (string, error) {
	return n.askUDP(ctx, local, remote, "?\n")
}

// AskUDPPeer is AskUDP sending PeerQuery: it returns the client address the
// server sees.
func (n *NS) AskUDPPeer(ctx context.Context, local, remote netip.AddrPort) (netip.AddrPort, error) {
	got, err := n.askUDP(ctx, local, remote, PeerQuery)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return parsePeer(got)
}

// parsePeer reads a server's PeerQuery answer. IPv4 clients of the
// dual-stack servers are shown as IPv4, not as v4-mapped IPv6.
func parsePeer(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("parse peer address %q: %w", s, err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func (n *NS) askUDP(ctx context.Context, local, remote netip.AddrPort, msg string) (string, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	c, err := n.DialFrom(ctx, "udp", addrPortString(local), remote.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(deadline(ctx)); err != nil {
		return "", fmt.Errorf("set deadline: %w", err)
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", fmt.Errorf("send datagram to %s: %w", remote, err)
	}
	buf := make([]byte, 64<<10)
	m, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("read answer from %s: %w", remote, err)
	}
	return strings.TrimSuffix(string(buf[:m]), "\n"), nil
}

// IsTimeout reports whether err means "no answer in time" (as opposed to a
// refusal or an unreachable error).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// Outcome names a failed ask as tests and the demo show it: "refused",
// "timeout", or else the error's text.
func Outcome(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case IsTimeout(err):
		return "timeout"
	}
	return err.Error()
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// addrPortString formats a local address for DialFrom: "" when nothing is
// fixed, and the unspecified address of the right family when only the port is.
func addrPortString(ap netip.AddrPort) string {
	switch {
	case ap.Addr().IsValid():
		return ap.String()
	case ap.Port() != 0:
		return fmt.Sprintf(":%d", ap.Port())
	default:
		return ""
	}
}

// Get fetches url (http://ADDR:PORT/...) from inside the namespace, within
// two seconds, and returns the status code and body.
func (n *NS) Get(ctx context.Context, url string) (int, []byte, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: n.Dial}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
