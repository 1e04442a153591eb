// Package e2e holds nftproxy's end-to-end scenarios: real nftproxy processes
// programming real tables in network namespaces (see e2e/netns), real packets
// proving what they do, and a real API server (e2e/apiserver) driving them.
// The non-test files are the harness the scenarios, the demo and the
// benchmark share: building and running the daemon inside a namespace.
package e2e
