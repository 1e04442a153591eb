// Package nftmodel is a small, sealed model of one nftables table as nftproxy
// writes it: chains (base or regular), rules built from a closed vocabulary of
// expressions, and named sets and maps with their elements (an interval set
// of concatenations holds ranges: each element a first and a last key).
//
// The model has one renderer to nft syntax (Render), whose text is exactly what
// `nft list table` prints once the same model has been applied over netlink; a
// pure Diff between an applied and a desired ruleset; and a packet tracer
// (Trace) that walks a ruleset as the kernel would.
//
// Nothing here talks to the kernel, or imports what does
// (TestModelImportsNoKernel): the netlink writer, reader and notification
// watcher are package nftnl, beside this one.
package nftmodel
