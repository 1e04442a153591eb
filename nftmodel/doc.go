// Package nftmodel is a small, sealed model of one nftables table as nftproxy
// writes it: chains (base or regular), rules built from a closed vocabulary of
// expressions, and named sets and maps with their elements.
//
// The model has one renderer to nft syntax (Render), whose text is exactly what
// `nft list table` prints once the same model has been applied over netlink; a
// pure Diff between an applied and a desired ruleset; and an applier that
// translates a full ruleset or a diff into one netlink batch: google/nftables
// encodes tables, chains, rules and sets, set elements are encoded straight
// into the batch's one buffer (netlink_wire.go), which goes out in a single
// sendmsg.
//
// The applier works on a Conn from the caller (Dial, or NewConn around a
// google/nftables connection): it reads the kernel's state through the
// library and sends batches on a socket the Conn keeps in the same network
// namespace (or hands them to the connection's test dialer), so tests can
// point it at a test dialer or at a namespace.
package nftmodel
