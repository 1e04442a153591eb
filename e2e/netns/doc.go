// Package netns is the network-namespace harness for kernel tests, packet-flow
// scenarios and the benchmark program.
//
// Every namespace is a named iproute2 namespace (`ip netns add`), so the nft,
// ip and conntrack command-line tools can enter it by name while Go code
// enters it through its file descriptor: nftnl.Dial(ns.Fd()) connects to
// its nftables, and Do runs a function on an OS thread switched into it. Sockets opened inside Do stay in the namespace, so servers and
// clients run as goroutines of the test process (Listen, ListenPacket, Dial,
// DialFrom, AskTCP, AskUDP).
//
// The core API returns errors and works outside tests; Require and New wrap
// it for tests, skipping with a clear message when the process is not root.
//
// Topology builds the service-proxy scenario layout: a client namespace
// outside the cluster, routed through a node namespace (where the proxy's
// rules go) to pod namespaces on a bridge, each pod able to run a server that
// answers with its own name. No namespace has a route to the host's uplink.
//
// Names are PREFIX-PID-COUNTER-RANDOM so parallel runs never collide;
// CleanupStale removes namespaces left by processes that died.
package netns
