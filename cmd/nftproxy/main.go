// Command nftproxy is a Kubernetes service proxy: it compiles Services and
// EndpointSlices into one nftables ruleset and applies it over netlink.
//
//	nftproxy [run] --manifests DIR | --kubeconfig FILE [flags]
//	nftproxy dump --manifests DIR [flags]
//	nftproxy explain --manifests DIR --src A --dst B --proto tcp --port N
//	nftproxy list [--family ip|ip6]
//	nftproxy cleanup [--kube-proxy]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
)

// version and commit are set by the image build (make image: -ldflags -X).
var version, commit = "dev", "unknown"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cmd := "run"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var o options
	fs := flag.NewFlagSet("nftproxy "+cmd, flag.ContinueOnError)
	o.register(fs)
	if cmd == "explain" {
		fs.StringVar(&o.src, "src", "192.168.77.2", "source address of the packet")
		fs.StringVar(&o.dst, "dst", "", "destination address of the packet")
		fs.StringVar(&o.proto, "proto", "tcp", "tcp, udp or sctp")
		fs.UintVar(&o.port, "port", 0, "destination port of the packet")
	}
	var family string
	switch cmd {
	case "run":
		fs.BoolVar(&o.cleanupKubeProxy, "cleanup-kube-proxy", false,
			"replace kube-proxy's rules: its nftables tables go in the batch of the first sync, its iptables chains right after it")
	case "cleanup":
		fs.BoolVar(&o.cleanupKubeProxy, "kube-proxy", false, "remove kube-proxy's nftables tables and iptables chains instead of nftproxy's tables")
	case "list":
		fs.StringVar(&family, "family", "", "ip or ip6 (default: both)")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := o.applyConfigFile(fs); err != nil {
		return err
	}
	if err := o.applyKubeProxyFlags(fs); err != nil {
		return err
	}
	if err := o.applyLogFlags(); err != nil {
		return err
	}
	logger, stopLog := newLogger(o.verbosity, o.log, os.Stdout, os.Stderr)
	defer stopLog()
	routeKlog(logger, o.verbosity)
	defer func() { _ = logger.Sync() }()
	for _, w := range o.warnings {
		logger.Warn(w)
	}
	if o.writeConfigTo != "" {
		return writeConfig(&o, logger)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch cmd {
	case "run":
		if o.kp.cleanup {
			logger.Info("--cleanup: removing nftproxy's tables and exiting, as kube-proxy --cleanup removes its rules")
			return cleanup()
		}
		logger.Info("Starting nftproxy", zap.String("version", version), zap.String("commit", commit))
		return runDaemon(ctx, &o, logger)
	case "version":
		fmt.Println(version, commit)
		return nil
	case "dump":
		return dump(os.Stdout, &o, logger)
	case "explain":
		return explain(os.Stdout, &o, logger)
	case "list":
		return list(os.Stdout, family)
	case "cleanup":
		if o.cleanupKubeProxy {
			return cleanupKubeProxy(ctx, logger)
		}
		return cleanup()
	}
	return fmt.Errorf("unknown command %q (want run, dump, explain, list, cleanup or version)", cmd)
}
