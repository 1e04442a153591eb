package cluster

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// relay forwards TCP connections made to an address of a namespace (the
// fabric) to the API server on the test process's own loopback. Nothing is
// routed to the host: the packets end in the fabric's socket, and this
// process copies the bytes.
type relay struct {
	l  net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func startRelay(ns *netns.NS, listen netip.AddrPort, apiURL string) (*relay, error) {
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("parse API server URL: %w", err)
	}
	l, err := ns.Listen("tcp", listen.String())
	if err != nil {
		return nil, err
	}
	r := &relay{l: l, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.pipe(c, u.Host) })
		}
	})
	return r, nil
}

func (r *relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *relay) untrack(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		delete(r.conns, c)
	}
}

func (r *relay) pipe(down net.Conn, target string) {
	defer down.Close()
	up, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return // the API server is down: the client sees the connection close
	}
	defer up.Close()
	if !r.track(down, up) {
		return
	}
	defer r.untrack(down, up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
	up.Close()
	down.Close()
	<-done
}

func (r *relay) close() {
	r.l.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
