// Command demo shows nftproxy working without a cluster: it builds a sandbox
// of network namespaces (a client, a node, three pods answering with their
// names), runs nftproxy in the node from a manifest directory, asks the
// services from the client, prints the kernel's ruleset (nftproxy list), and removes the sandbox.
// It needs root; nothing is changed outside the namespaces it creates.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

func main() {
	binary := flag.String("nftproxy", "bin/nftproxy", "the nftproxy binary")
	manifests := flag.String("manifests", "deploy/examples", "manifest directory to serve")
	flag.Parse()
	if err := demo(*binary, *manifests); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func demo(binary, manifests string) (err error) {
	if why := netns.Usable(); why != "" {
		return errors.New(why)
	}
	fmt.Println("== building the sandbox: client ns <-> node ns <-> bridge <-> 3 pod namespaces")
	topo, err := netns.BuildTopology(netns.TopologyOptions{Prefix: "demo"})
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, topo.Close())
		fmt.Println("== sandbox removed")
	}()
	for _, p := range topo.Pods {
		for _, srv := range []struct {
			proto string
			port  int
		}{{"tcp", 8080}, {"udp", 5353}} {
			if _, err := p.ServeName(srv.proto, srv.port); err != nil {
				return err
			}
		}
		fmt.Printf("   pod %s at %s serves its name on tcp/8080 and udp/5353\n", p.Name, p.Addr)
	}

	fmt.Printf("== nftproxy run --manifests %s (in the node namespace)\n", manifests)
	d, err := e2e.Start(topo.Node, binary, "--manifests", manifests, "--hostname-override", "node-1",
		"--cluster-cidr", "10.244.0.0/16,fd00:10:244::/48",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249")
	if err != nil {
		return err
	}
	defer func() { _ = d.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.WaitSynced(ctx, 1); err != nil {
		return err
	}

	ask := func(what string, n int, f func() (string, error)) {
		var answers []string
		for range n {
			a, err := f()
			if err != nil {
				a = "error: " + netns.Outcome(err)
			}
			answers = append(answers, a)
		}
		fmt.Printf("   %-40s -> %s\n", what, strings.Join(answers, " "))
	}
	tcp := func(ap string) func() (string, error) {
		return func() (string, error) { return topo.Client.AskTCP(ctx, netip.MustParseAddrPort(ap)) }
	}
	udp := func(ap string) func() (string, error) {
		return func() (string, error) { return topo.Client.AskUDP(ctx, netip.AddrPort{}, netip.MustParseAddrPort(ap)) }
	}
	fmt.Println("== asking from the client namespace (192.168.77.2, outside the cluster)")
	ask("ClusterIP  tcp 10.96.0.10:80 (web)", 8, tcp("10.96.0.10:80"))
	ask("NodePort   tcp 192.168.77.1:30080 (web)", 8, tcp("192.168.77.1:30080"))
	ask("ClusterIP  udp 10.96.0.53:53 (dns)", 6, udp("10.96.0.53:53"))
	ask("no endpoints tcp 10.96.0.99:80 (empty)", 1, tcp("10.96.0.99:80"))
	fmt.Println("== from pod-0 (in the cluster; hairpin when it picks itself)")
	ask("ClusterIP  tcp 10.96.0.10:80 (web)", 8, func() (string, error) {
		return topo.Pods[0].NS.AskTCP(ctx, netip.MustParseAddrPort("10.96.0.10:80"))
	})

	// nftproxy list reads the table back over netlink and prints it as
	// `nft list table` would, so the demo needs no nft binary.
	out, err := topo.Node.Exec(binary, "list", "--family", "ip")
	if err != nil {
		return err
	}
	fmt.Println("== nftproxy list --family ip (in the node namespace: the kernel's table, as nft lists it)")
	fmt.Print(out)
	return nil
}
