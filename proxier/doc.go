// Package proxier turns a k8s.Snapshot into nftproxy's nftables ruleset
// (Compile, a pure function), and runs the sync loop that diffs it against
// what the kernel holds, applies the difference in one netlink batch, cleans
// stale conntrack flows and records health and metrics.
package proxier
