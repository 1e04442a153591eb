// Package nftmodel is a small, sealed model of one nftables table as nftproxy
// writes it: chains (base or regular), rules built from a closed vocabulary of
// expressions, and named sets and maps with their elements.
//
// The model has one renderer to nft syntax (Render), whose text is exactly what
// `nft list table` prints once the same model has been applied over netlink; a
// pure Diff between an applied and a desired ruleset; and an applier that
// translates a full ruleset or a diff into one google/nftables batch.
//
// Nothing in this package opens a kernel connection by itself: the applier
// takes its *nftables.Conn from the caller, so tests can point it at a test
// dialer or at a network namespace.
package nftmodel
