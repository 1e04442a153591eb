package conntrack_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/k8s"
)

// A DNS service loses one of its two endpoints: the UDP flow DNATed to it is
// deleted, the one to the surviving endpoint stays. In the daemon the table
// is conntrack.Dial(netnsFd) instead of a FakeTable.
func Example() {
	dns := func(eps ...string) *k8s.Snapshot {
		sp := k8s.ServicePort{
			Name:       k8s.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns", Protocol: k8s.UDP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Port:       53,
		}
		for _, e := range eps {
			sp.Endpoints = append(sp.Endpoints, k8s.Endpoint{Addr: netip.MustParseAddr(e), Port: 53, Ready: true, Serving: true})
		}
		return &k8s.Snapshot{Services: []k8s.ServicePort{sp}}
	}
	flow := func(client, endpoint string) conntrack.Flow {
		return conntrack.Flow{
			Proto:    17,
			OrigSrc:  netip.MustParseAddrPort(client),
			OrigDst:  netip.MustParseAddrPort("10.96.0.10:53"),
			ReplySrc: netip.MustParseAddrPort(endpoint),
			ReplyDst: netip.MustParseAddrPort(client),
		}
	}
	table := &conntrack.FakeTable{Flows: []conntrack.Flow{
		flow("10.244.0.7:41000", "10.244.1.5:53"),
		flow("10.244.0.8:41000", "10.244.2.6:53"),
	}}

	r := conntrack.NewReconciler(table)
	res, err := r.Reconcile(context.Background(), dns("10.244.1.5", "10.244.2.6"), dns("10.244.2.6"))
	if err != nil {
		fmt.Println("reconcile:", err)
		return
	}
	fmt.Println("deleted", res.Deleted, "of", res.Dumped)
	for _, f := range table.Deleted {
		fmt.Println(f)
	}
	// Output:
	// deleted 1 of 2
	// udp 10.244.0.7:41000 -> 10.96.0.10:53 => 10.244.1.5:53
}
