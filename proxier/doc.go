// Package proxier turns a k8s.Snapshot into nftproxy's nftables ruleset
// (Compile, a pure function, built from one piece per service port), and runs
// the sync loop: a full sync applies the whole ruleset; a later one
// recompiles only the service ports that changed and sends the changes of
// their pieces (the incremental compiler), in one netlink batch either way;
// a wide service port's endpoint change, handed over as a delta, patches
// its kept lists instead (patch.go), at the cost of the endpoints changed.
// After each sync it cleans stale conntrack flows and records health and
// metrics.
package proxier
