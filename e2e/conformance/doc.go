// Package conformance runs Kubernetes' own e2e Services tests against
// nftproxy on real nodes: each node is a network namespace (with a mount
// namespace of its own) running containerd, kubelet and the proxy, so pods
// that a kubelet started carry the traffic. The same run repeats the suite
// with the reference kube-proxy in nftables mode and writes both results to
// docs/conformance.md.
//
// It is not part of make test: `make conformance` sets NFTPROXY_CONFORMANCE
// and runs TestConformance. build.sh builds the programs and images it needs
// from Go modules and C source, offline; node.sh is one node.
package conformance
