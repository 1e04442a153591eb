package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// A kernel watch tells when a change is in a namespace's ruleset: the wall
// time of a step ends there.
type kernelWatch interface {
	// seen blocks until the ruleset holds the change, and returns when it
	// got there.
	seen(ctx context.Context) (time.Time, error)
	close()
}

// kernelChange is what a step puts into the ruleset, in the forms a watch looks
// for: the address as the kernel stores it, and as iptables-save prints it.
type kernelChange struct {
	addr netip4
	text string // e.g. "--to-destination 10.192.0.1:8080"
}

// netip4 is an IPv4 address in network byte order.
type netip4 [4]byte

// nfnlGroupNftables is NFNLGRP_NFTABLES: every committed nf_tables change
// is announced to it.
const nfnlGroupNftables = 7

// nftWatch listens to the namespace's nf_tables notifications. The kernel
// sends them when it commits a batch, with the objects' contents (set
// element keys and data, rule expressions with their immediate data, chain
// names), so a commit that names the address is the moment the change is in
// the kernel. It serves every proxy that programs nf_tables: nftproxy,
// kube-proxy's nftables mode and its iptables mode on the nft backend. It
// costs the proxy nothing, where dumping a 10,000-service table after each
// poll would take tens of milliseconds of the CPU the proxy syncs with.
type nftWatch struct {
	conn *netlink.Conn
	want []byte
	at   chan time.Time
	done chan struct{}

	mu        sync.Mutex
	overflows int
}

// watchNft subscribes before the step's API write, so nothing committed
// after the write can be missed.
func watchNft(ns *netns.NS, c kernelChange) (*nftWatch, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns.Fd()})
	if err != nil {
		return nil, fmt.Errorf("dial nf_tables notifications: %w", err)
	}
	// A partial sync of kube-proxy's iptables mode rewrites KUBE-SERVICES
	// whole: tens of thousands of notifications in one commit.
	if raw, err := conn.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20)
		})
	}
	if err := conn.JoinGroup(nfnlGroupNftables); err != nil {
		conn.Close()
		return nil, fmt.Errorf("join nf_tables notifications: %w", err)
	}
	w := &nftWatch{conn: conn, want: c.addr[:], at: make(chan time.Time, 1), done: make(chan struct{})}
	go w.read()
	return w, nil
}

func (w *nftWatch) read() {
	defer close(w.done)
	found := false
	for {
		msgs, err := w.conn.Receive()
		now := time.Now()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				w.mu.Lock()
				w.overflows++
				w.mu.Unlock()
				continue
			}
			return // closed
		}
		for _, m := range msgs {
			if !found && bytes.Contains(m.Data, w.want) {
				found = true
				w.at <- now
			}
		}
	}
}

func (w *nftWatch) seen(ctx context.Context) (time.Time, error) {
	select {
	case t := <-w.at:
		return t, nil
	case <-ctx.Done():
		w.mu.Lock()
		n := w.overflows
		w.mu.Unlock()
		if n > 0 {
			return time.Time{}, fmt.Errorf("wait for the change in nf_tables: %w (%d notification overflows)", ctx.Err(), n)
		}
		return time.Time{}, fmt.Errorf("wait for the change in nf_tables: %w", ctx.Err())
	}
}

func (w *nftWatch) close() {
	w.conn.Close()
	<-w.done
}

// saveWatch polls iptables-legacy-save, which is the only way to read the
// legacy tables: they have no notifications. Each poll reads the whole nat
// table, so its resolution is one save's duration (the tables say how long
// kube-proxy's own restores take at the same size).
type saveWatch struct {
	ns   *netns.NS
	save string
	want string
}

func watchSave(ns *netns.NS, save string, c kernelChange) *saveWatch {
	return &saveWatch{ns: ns, save: save, want: c.text}
}

func (w *saveWatch) seen(ctx context.Context) (time.Time, error) {
	for {
		out, err := w.dump(ctx)
		now := time.Now()
		if err != nil {
			return time.Time{}, err
		}
		if strings.Contains(out, w.want) {
			return now, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("wait for %q in %s: %w", w.want, w.save, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (w *saveWatch) dump(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, w.save, "-t", "nat")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := w.ns.Do(cmd.Start); err != nil {
		return "", fmt.Errorf("start %s: %w", w.save, err)
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("wait for %q in %s: %w", w.want, w.save, ctx.Err())
		}
		return "", fmt.Errorf("run %s: %w", w.save, err)
	}
	return out.String(), nil
}

func (w *saveWatch) close() {}
