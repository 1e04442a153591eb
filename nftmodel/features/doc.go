// Package features probes the running kernel, once, for each kernel feature
// nftproxy's ruleset and flow cleanup use, the way cilium/ebpf probes BPF
// features: a Feature names what it checks and the first Linux release that
// has it, a Prober runs each probe at most once and keeps its result, and a
// missing feature is an *UnsupportedError matching ErrNotSupported.
//
// nftables probes program the objects nftproxy programs (base chains of both
// types on every hook it uses, numgen, fib, concatenated and typeof set keys
// with user data, timeouts, verdict maps, ct expressions, DNAT from a map) in
// a table of their own with a unique name, in one batch that adds the table
// and deletes it again: the kernel checks every object while preparing the
// batch, and the table is gone when the batch commits, whatever happens to
// the prober afterwards. No other table is read or touched.
//
// The package depends on google/nftables, ti-mo/conntrack, mdlayher/netlink
// and x/sys only, so that it can run before anything else of nftproxy does.
package features
