package netns

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Relay forwards TCP connections made to an address inside a namespace to a
// target address of the calling process's own namespace (the API server on
// the host's loopback, say). Nothing is routed out of the namespace: its
// packets end in the relay's socket, and this process copies the bytes.
type Relay struct {
	addr   string // where it listens, inside the namespace
	target string
	l      net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	cut    bool // partitioned: no connection gets through
}

// StartRelay listens on listen ("127.0.0.1:0" picks a port) inside ns and
// relays each connection to target.
func StartRelay(ns *NS, listen, target string) (*Relay, error) {
	l, err := ns.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("start relay in %s: %w", ns, err)
	}
	r := &Relay{addr: l.Addr().String(), target: target, l: l, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.pipe(c) })
		}
	})
	return r, nil
}

// Addr is where the relay listens, inside its namespace.
func (r *Relay) Addr() string { return r.addr }

// SetCut partitions the namespace from the target (closing the open
// connections and refusing new ones) or ends the partition.
func (r *Relay) SetCut(cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = cut
	if cut {
		r.closeConns()
	}
}

// Close stops accepting, cuts every open connection and waits for the pipes.
func (r *Relay) Close() {
	r.l.Close()
	r.mu.Lock()
	r.closed = true
	r.closeConns()
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *Relay) closeConns() {
	for c := range r.conns {
		c.Close()
	}
}

// track registers the connections of a pipe, or reports false when none may
// pass.
func (r *Relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.cut {
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *Relay) untrack(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		delete(r.conns, c)
	}
}

func (r *Relay) pipe(down net.Conn) {
	defer down.Close()
	up, err := net.DialTimeout("tcp", r.target, 2*time.Second)
	if err != nil {
		return // the target is down: the client sees the connection close
	}
	defer up.Close()
	if !r.track(down, up) {
		return
	}
	defer r.untrack(down, up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done // either side gone: close both, which ends the other copy
	up.Close()
	down.Close()
	<-done
}
