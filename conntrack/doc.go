// Package conntrack removes conntrack entries that a ruleset change left
// pointing at the wrong place.
//
// Connection tracking remembers the DNAT decision of a flow, so a UDP client
// (DNS above all) keeps sending to an endpoint that no longer exists for as
// long as its entry lives, and a client whose first packets reached a service
// port without endpoints keeps bypassing the new endpoints. After each
// successful sync the proxier calls Reconciler.Reconcile, which dumps the
// table, picks the stale flows with Stale and deletes them one by one: the
// kernel can't filter a dump on tuples, so the filtering happens here.
//
// Stale is a pure function of the flows and the previous and new snapshots.
// It only ever selects UDP and SCTP flows whose original destination is a
// service address and port (ClusterIP, ExternalIP, LoadBalancer IP, or a node
// address with the NodePort): TCP flows, flows of other programs and flows to
// endpoints that still serve are never touched.
//
// Table is the narrow interface to the kernel: Conn implements it over
// netlink (github.com/ti-mo/conntrack) in one network namespace, FakeTable
// implements it in memory for unit tests and records what it deleted.
//
// The package records no metrics and writes no logs: Reconcile returns counts
// and the time spent in a Result, and the proxier turns them into
// kubeproxy_conntrack_reconciler_* metrics and log lines.
package conntrack
