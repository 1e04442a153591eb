package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// A watcher tells when what a step waits for came: the change in a
// namespace's ruleset, where the wall time of a step ends, or the API
// server's event to a bare watch.
type watcher struct {
	what string // for errors
	done chan struct{}
	at   time.Time
	err  error
	stop func()
	once sync.Once
}

// startWatcher runs look, which returns when it found what it waits for;
// stop makes it return early.
func startWatcher(what string, look func() (time.Time, error), stop func()) *watcher {
	w := &watcher{what: what, done: make(chan struct{}), stop: stop}
	go func() {
		defer close(w.done)
		w.at, w.err = look()
	}()
	return w
}

// seen blocks until the watcher found it, and returns when that was. It
// ends the watch: one left open would cost the proxy's next syncs.
func (w *watcher) seen(ctx context.Context) (time.Time, error) {
	defer w.close()
	select {
	case <-w.done:
		return w.at, w.err
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("wait for %s: %w", w.what, ctx.Err())
	}
}

func (w *watcher) close() {
	w.once.Do(func() {
		w.stop()
		<-w.done
	})
}

// kernelChange is what a step puts into the ruleset, in the forms a watch looks
// for: the address as the kernel stores it, and as iptables-save prints it.
type kernelChange struct {
	addr [4]byte
	text string // e.g. "--to-destination 10.192.0.1:8080"
}

// watchNft listens to the namespace's nf_tables notifications. The kernel
// sends them when it commits a batch, with the objects' contents (set
// element keys and data, rule expressions with their immediate data, chain
// names), so a commit that names the address is the moment the change is in
// the kernel. It serves every proxy that programs nf_tables: nftproxy,
// kube-proxy's nftables mode and its iptables mode on the nft backend. It
// costs the proxy nothing, where dumping a 10,000-service table after each
// poll would take tens of milliseconds of the CPU the proxy syncs with.
// It subscribes before the step's API write, so nothing committed after the
// write can be missed.
func watchNft(ns *netns.NS, c kernelChange) (*watcher, error) {
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
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return nil, fmt.Errorf("join nf_tables notifications: %w", err)
	}
	names := func(m netlink.Message) bool { return bytes.Contains(m.Data, c.addr[:]) }
	return startWatcher("the change in nf_tables", func() (time.Time, error) {
		for {
			msgs, err := conn.Receive()
			now := time.Now()
			switch {
			case errors.Is(err, unix.ENOBUFS):
			case err != nil:
				return now, fmt.Errorf("read nf_tables notifications: %w", err)
			case slices.ContainsFunc(msgs, names):
				return now, nil
			}
		}
	}, func() { conn.Close() }), nil
}

// watchSave polls save (iptables-legacy-save), which is the only way to
// read the legacy tables: they have no notifications. Each poll reads the
// whole nat table, so its resolution is one save's duration (the tables say
// how long kube-proxy's own restores take at the same size).
func watchSave(ns *netns.NS, save string, c kernelChange) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	return startWatcher(fmt.Sprintf("%q in %s", c.text, save), func() (time.Time, error) {
		for {
			cmd := exec.CommandContext(ctx, save, "-t", "nat")
			var out bytes.Buffer
			cmd.Stdout = &out
			if err := ns.Do(cmd.Start); err != nil {
				return time.Time{}, fmt.Errorf("start %s: %w", save, err)
			}
			err := cmd.Wait()
			now := time.Now()
			if ctx.Err() != nil {
				return now, ctx.Err()
			} else if err != nil {
				return now, fmt.Errorf("run %s: %w", save, err)
			}
			if strings.Contains(out.String(), c.text) {
				return now, nil
			}
			time.Sleep(5 * time.Millisecond)
		}
	}, cancel)
}
