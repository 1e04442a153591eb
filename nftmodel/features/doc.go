// Package features probes the running kernel, once, for each kernel feature
// nftproxy's ruleset and flow cleanup use, the way cilium/ebpf probes BPF
// features: a Feature names what it checks and the first Linux release that
// has it, a Prober runs each probe at most once and keeps its result, and a
// missing feature is an *UnsupportedError matching ErrNotSupported.
//
// nftables probes describe, as nftmodel rulesets, the objects nftproxy
// programs (base chains of both types on every hook it uses, numgen, fib,
// concatenated and typeof set keys with user data, timeouts, verdict maps,
// ct expressions, DNAT from a map), and nftnl writes them as it writes
// nftproxy's tables (nftnl.Create): the kernel is asked for exactly the
// bytes nftproxy will send. Each probe's table has a unique name, one per
// family, and is owned by the probe's socket where the kernel can (Linux
// 5.12): its own batch commits it, so that the kernel runs its commit-time
// checks too, and the socket's closing removes it (a second batch, on older
// kernels). No other table is read or touched. Change notifications are
// watched with nftnl's Watcher; conntrack is probed with ti-mo/conntrack.
//
// Like everything outside nftnl, the package never touches google/nftables.
package features
