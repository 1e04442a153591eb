package main

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// relay forwards TCP connections made to 127.0.0.1 inside a namespace to an
// address of the bench's own namespace (the API server on loopback). The
// namespace keeps no route anywhere: only this process carries its bytes,
// and the root namespace gets no interface, address or rule.
type relay struct {
	addr string // where it listens, inside the namespace
	l    net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func startRelay(ns *netns.NS, target string) (*relay, error) {
	l, err := ns.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{addr: l.Addr().String(), l: l, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.pipe(c, target) })
		}
	})
	return r, nil
}

// Close stops accepting, cuts every open connection and waits for the pipes.
func (r *relay) Close() {
	r.l.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
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
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
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
