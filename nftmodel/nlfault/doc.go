// Package nlfault injects faults into the netlink batches an nftnl.Conn
// sends, for tests: the kernel refusing a given message, send and receive
// errors, a truncated reply and a stalled send. Refusals are real: the
// message is spoiled so that the kernel itself refuses it and aborts the
// batch.
package nlfault
