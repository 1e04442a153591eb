package apiserver

import (
	"fmt"
	"net/url"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Relay makes the API server reachable from inside ns, which has no route to
// the host on purpose: a relay listens on 127.0.0.1 in ns (the root
// namespace gets no interface, address or rule), and a copy of the admin
// kubeconfig that goes through it, acting as identity when that is set, is
// written to path. The caller closes the relay.
func (s *Server) Relay(ns *netns.NS, identity, path string) (*netns.Relay, error) {
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil, fmt.Errorf("parse API server address: %w", err)
	}
	r, err := netns.StartRelay(ns, "127.0.0.1:0", u.Host)
	if err != nil {
		return nil, err
	}
	if err := RelayedKubeconfig(s.Kubeconfig, r.Addr(), identity, path); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}
