// Package features probes the running kernel, once, for each kernel feature
// nftproxy's ruleset and flow cleanup use, the way cilium/ebpf probes BPF
// features: a Feature names what it checks and the first Linux release that
// has it, a Prober runs each probe at most once and keeps its result, and a
// missing feature is an *UnsupportedError matching ErrNotSupported.
//
// nftables probes program the objects nftproxy programs (base chains of both
// types on every hook it uses, numgen, fib, concatenated and typeof set keys
// with user data, timeouts, verdict maps, ct expressions, DNAT from a map) in
// a table of their own per family, with a unique name, owned by the probe's
// socket: one batch commits it, so that the kernel runs its commit-time
// checks too, and a second deletes it. No other table is read or touched.
//
// The package lives under nftnl because its probes describe those objects
// in google/nftables' terms, below what the model can say (and some on
// purpose outside it, to see a refusal); nftnl encodes and sends them
// (RawBatch), with its typeof user data and its naming of a refused message.
// Change notifications are watched with nftnl's Watcher; conntrack is probed
// with ti-mo/conntrack.
package features
