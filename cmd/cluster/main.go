// Command cluster starts a whole cluster's data plane in network namespaces
// and keeps it up until Ctrl-C: a real kube-apiserver and etcd, K nodes
// each running its own nftproxy against it, pods answering with their
// names, a routing fabric, an external client and a load balancer in front
// of the example web service's NodePort. deploy/examples' Services and
// EndpointSlices are applied through the API server. It prints how to reach
// everything, and removes everything on SIGINT or SIGTERM. It needs root
// and the binaries of `make k8s-bins`; nothing is changed outside the
// namespaces it creates.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// prefix starts the names of the namespaces this command makes.
const prefix = "nftk"

func main() {
	binary := flag.String("nftproxy", "bin/nftproxy", "the nftproxy binary the nodes run")
	nodes := flag.Int("nodes", 3, "number of nodes")
	pods := flag.Int("pods", 3, "pods per node (deploy/examples uses 10.244.1.10-12 on node-1)")
	examples := flag.String("manifests", "deploy/examples", "directory of Services and EndpointSlices to apply")
	dir := flag.String("dir", "", "where to write the kubeconfigs (default: a new directory under /tmp, removed at exit)")
	deploy := flag.String("deploy", "deploy", "directory of the ServiceAccount and RBAC the daemons act as")
	flag.Parse()
	if err := run(*binary, *nodes, *pods, *examples, *dir, *deploy); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(binary string, nodes, pods int, examples, dir, deploy string) (err error) {
	if why := netns.Usable(); why != "" {
		return errors.New(why)
	}
	if binary, err = filepath.Abs(binary); err != nil {
		return err
	}
	if _, err := os.Stat(binary); err != nil {
		return fmt.Errorf("nftproxy binary: %w (make build)", err)
	}
	// A run killed with SIGKILL leaves its namespaces; remove them now.
	if gone, err := netns.CleanupStale(prefix); err != nil {
		return err
	} else if len(gone) > 0 {
		fmt.Printf("removed %d namespaces left by an earlier run\n", len(gone))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Printf("== "+format+"\n", args...) }
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(startCtx, cluster.Options{Binary: binary, Nodes: nodes, PodsPerNode: pods, Prefix: prefix, Dir: dir, DeployDir: deploy, Logf: logf})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("== tearing down")
		err = errors.Join(err, c.Close())
		fmt.Println("== every namespace, process and file removed")
	}()
	for _, p := range c.Topo.Pods() {
		for _, srv := range []struct {
			proto string
			port  int
		}{{"tcp", 8080}, {"udp", 5353}} {
			if _, err := p.ServeName(srv.proto, srv.port); err != nil {
				return err
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(examples, "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := c.Apply(ctx, f); err != nil {
			return err
		}
		logf("applied %s", f)
	}
	var backends []cluster.Backend
	for _, n := range c.Topo.Nodes {
		backends = append(backends, cluster.Backend{Node: n.Name, Addr: netip.AddrPortFrom(n.Addr, 30080),
			Health: fmt.Sprintf("http://%s/healthz", netip.AddrPortFrom(n.Addr, cluster.HealthzPort))})
	}
	lb, err := c.StartLoadBalancer(80, backends, time.Second)
	if err != nil {
		return err
	}
	printHowTo(c, lb)
	<-ctx.Done()
	fmt.Println()
	return nil
}

func printHowTo(c *cluster.Cluster, lb *cluster.LoadBalancer) {
	first := c.Topo.Nodes[0]
	pod := first.Pods[0]
	ask := func(ns *netns.NS, addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		return fmt.Sprintf("ip netns exec %s bash -c 'exec 3<>/dev/tcp/%s/%s; head -1 <&3'", ns, host, port)
	}
	fmt.Printf(`
The cluster is up. Ctrl-C removes it.

  kubectl --kubeconfig %s get nodes,services,endpointslices -A -o wide

Namespaces:
  fabric (router, API server relay on %s:%d)  %s
  external client (%s)                     %s
  load balancer (%s, user-space)         %s
`, c.Kubeconfig, netns.FabricAddr, cluster.APIPort, c.Topo.Fabric, netns.ClusterClientAddr, c.Topo.Client, lb.Addr().Addr(), c.Topo.LoadBalancer)
	for _, n := range c.Topo.Nodes {
		var pods []string
		for _, p := range n.Pods {
			pods = append(pods, fmt.Sprintf("%s %s", p.Addr, p.NS))
		}
		fmt.Printf("  %s (%s, pods %s)  %s\n      pods: %s\n", n.Name, n.Addr, n.PodCIDR, n.NS, strings.Join(pods, ", "))
	}
	fmt.Printf(`
Try (the pods answer with their names on tcp/8080 and udp/5353):
  %s                 # ClusterIP of default/web from a pod
  %s             # NodePort 30080 from outside
  %s             # through the load balancer (checks /healthz on :%d)
  ip netns exec %s nft list table ip nftproxy
  ip netns exec %s curl -s http://%s:%d/healthz
  kubectl --kubeconfig %s taint node %s ToBeDeletedByClusterAutoscaler=1:NoSchedule   # drain it from the load balancer
Each node's daemon uses %s (through the relay, as the nftproxy ServiceAccount).
`, ask(pod.NS, "10.96.0.10:80"), ask(c.Topo.Client, netip.AddrPortFrom(first.Addr, 30080).String()),
		ask(c.Topo.Client, lb.Addr().String()), cluster.HealthzPort,
		first.NS, c.Topo.LoadBalancer, first.Addr, cluster.HealthzPort, c.Kubeconfig, first.Name, c.NodeKubeconfig)
}
