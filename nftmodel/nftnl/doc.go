// Package nftnl is nftproxy's side of the kernel for nftables: it writes an
// nftmodel ruleset, or the changes between two, as one netlink batch (Apply,
// ApplyChanges), or a new table without reading the kernel first (Create,
// for the feature probes, and Drop), reads a table back into the model
// (Read), and reports the namespace's nftables notifications (Watch). For
// other programs' tables, which the model can't describe (iptables-nft's),
// it lists chains and the rules that jump from them (Conn.Chains,
// Conn.Jumps) and deletes given rules and chains in one batch
// (Conn.DeleteRulesAndChains).
//
// google/nftables encodes tables, chains, rules and sets (captured without
// sending, see libEncoder), set elements are encoded straight into the
// batch's one buffer (wire.go), which goes out in a single sendmsg.
//
// The module is pinned to a master pseudo-version: its one tag, v0.3.0,
// lacks what nftproxy uses (checked 2026-12-05 by building against it:
// Conn.GetGen, TableFlags and TableFlagOwner, the conntrack address keys
// expr.CtKeySRCIP/DSTIP(6), Set.DataInterval). The capture through the
// library's test hook, TestDial, stays the one seam into its encoding,
// with the framing check and TestLibEncoderGolden beside it. What would
// remove it upstream: a call that returns the messages a Conn has queued
// (the batch Flush would send) without sending them.
//
// Everything works on a Conn from the caller (Dial): it reads the kernel's
// state through the library and sends batches on a socket it keeps in the
// same network namespace, so tests point it at a namespace of their own, or
// at a test dialer. The library's connection stays inside the Conn.
package nftnl
