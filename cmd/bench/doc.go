// Command bench is nftproxy's benchmark program (`make bench`): full syncs,
// incremental updates, connect latency and memory, for nftproxy against the
// same ruleset through `nft -f` and kube-proxy's iptables ruleset through
// iptables-legacy-restore and iptables-nft-restore. It runs as root, only
// inside network namespaces it creates and removes, and writes
// docs/benchmarks.md, its plots and the raw results.
//
//	go run ./cmd/bench [--quick] [--sizes 1000,5000] [--phases sync,updates,dataplane,daemon,gobench]
//	go run ./cmd/bench --render cmd/bench/results.json   # rewrite the docs from saved results
package main
