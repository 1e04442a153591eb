package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"go.uber.org/zap"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

const routeLocalnetSysctl = "net/ipv4/conf/all/route_localnet"

// routeLocalnet readies route_localnet for --localhost-nodeports. It is
// turned on only after the first sync, once the localnet guard is in the
// kernel: before it, a neighbour could reach the node's 127.0.0.1 services.
// Whether nftproxy turned it on (it was off, or the previous run's guard
// says so) goes into the guard's comment, for cleanup. It returns what
// turns it on (nil when nothing is to do), and fails at once when it could
// not be turned on, before any rule.
func routeLocalnet(conn *nftnl.Conn, cfgs []proxier.Config) (func(*zap.Logger) error, error) {
	i := slices.IndexFunc(cfgs, func(c proxier.Config) bool { return c.Family == nftmodel.IPv4 && c.LocalhostNodePorts })
	if i < 0 {
		return nil, nil
	}
	cur, err := readSysctl(routeLocalnetSysctl)
	if err != nil {
		return nil, fmt.Errorf("read route_localnet: %w", err)
	}
	cfgs[i].RouteLocalnetOwned = cur == 0 || ownsRouteLocalnet(conn)
	if cur != 0 {
		return nil, nil
	}
	f, err := os.OpenFile(filepath.Join(procSys.root, routeLocalnetSysctl), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("enable route_localnet for --localhost-nodeports (needs a writable /proc/sys): %w", err)
	}
	_ = f.Close()
	return func(log *zap.Logger) error {
		return procSys.apply(log, []sysctl{{name: routeLocalnetSysctl, value: 1}})
	}, nil
}

// ownsRouteLocalnet tells whether nftproxy's IPv4 table in the kernel says
// that nftproxy turned route_localnet on.
func ownsRouteLocalnet(conn *nftnl.Conn) bool {
	rs, err := nftnl.Read(conn, nftmodel.IPv4, proxier.TableName)
	return err == nil && proxier.RouteLocalnetOwned(rs)
}

// restoreRouteLocalnet turns route_localnet off again when owned, after
// cleanup removed the guard.
func restoreRouteLocalnet(owned bool) error {
	if !owned {
		return nil
	}
	if err := os.WriteFile(filepath.Join(procSys.root, routeLocalnetSysctl), []byte("0"), 0o644); err != nil {
		return fmt.Errorf("restore route_localnet=0: %w", err)
	}
	return nil
}
