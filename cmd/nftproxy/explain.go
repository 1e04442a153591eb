package main

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/proxier"
)

// explain traces one packet through the ruleset the flags would apply.
func explain(w io.Writer, o *options, logger *zap.Logger) error {
	src, err := netip.ParseAddr(o.src)
	if err != nil {
		return fmt.Errorf("parse --src: %w", err)
	}
	dst, err := netip.ParseAddr(o.dst)
	if err != nil {
		return fmt.Errorf("parse --dst: %w", err)
	}
	proto, ok := map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}[strings.ToLower(o.proto)]
	if !ok {
		return fmt.Errorf("parse --proto: %q is not tcp, udp or sctp", o.proto)
	}
	if o.port == 0 || o.port > 65535 {
		return fmt.Errorf("parse --port: %d is not a port", o.port)
	}
	cfgs, snap, err := loadOffline(o, logger)
	if err != nil {
		return err
	}
	family := nftmodel.IPv4
	if dst.Is6() {
		family = nftmodel.IPv6
	}
	i := slices.IndexFunc(cfgs, func(c proxier.Config) bool { return c.Family == family })
	rs := proxier.Compile(snap, cfgs[i])
	local := snap.Node.Addrs
	pkt := nftmodel.Packet{Src: src, Dst: dst, Proto: proto, SrcPort: 40000, DstPort: uint16(o.port),
		Local: func(a netip.Addr) bool { return slices.Contains(local, a) || a.IsLoopback() }}
	if pkt.Local(src) {
		pkt.Hook = nftmodel.HookOutput
	}
	out := nftmodel.Trace(rs, pkt)
	fmt.Fprintf(w, "packet %s %s -> %s:%d (node addresses %v)\n", o.proto, src, dst, o.port, local)
	for _, s := range out.Steps {
		fmt.Fprintln(w, "  "+s)
	}
	fmt.Fprintf(w, "verdict: %s\n", out.Verdict)
	for _, ep := range out.Endpoints {
		fmt.Fprintf(w, "endpoint: %s\n", ep)
	}
	fmt.Fprintf(w, "masquerade: %v\n", out.Masquerade)
	return nil
}
