package netns_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// A benchmark program (no testing.T) builds the topology, serves names in the
// pods and asks one from the client. It needs root, so it has no Output check.
func ExampleBuildTopology() {
	topo, err := netns.BuildTopology(netns.TopologyOptions{Prefix: "npex", Pods: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer topo.Close()
	for _, p := range topo.Pods {
		if _, err := p.ServeName("tcp", 8080); err != nil {
			log.Fatal(err)
		}
	}
	// Rules for the node go through nftnl.Dial(topo.Node.Fd()) or topo.Node.Exec("nft", ...).
	name, err := topo.Client.AskTCP(context.Background(), netip.AddrPortFrom(topo.Pods[1].Addr6, 8080))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(name)
}
