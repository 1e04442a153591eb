package nftnl

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// libEncoder has google/nftables encode tables, chains, rules and sets
// without sending them: the batch copies the messages into its own buffer
// (see batch.send).
//
// The library has no API that returns the messages it encodes: its Conn
// queues them and sends them at Flush. Its test hook, TestDial, stands in
// for the socket, so a Conn with one hands us the batch instead of the
// kernel. The hook is meant for the library's tests, not for production,
// and the module is pinned to a pseudo-version; so this type is the one
// place that relies on it, it checks the framing of every batch it is
// handed, and TestLibEncoderGolden fails when the pinned library encodes
// anything nftproxy sends differently.
type libEncoder struct {
	// Conn queues the messages (AddTable, AddRule, …); never dialled.
	*nftables.Conn
	msgs []netlink.Message
	err  error
}

func newLibEncoder() *libEncoder {
	e := &libEncoder{}
	e.Conn = &nftables.Conn{TestDial: e.capture}
	return e
}

// capture receives what the library would send. At Flush that is one batch
// (batch begin, the queued messages, batch end), sent once; the library's
// reads for replies come with no messages.
func (e *libEncoder) capture(req []netlink.Message) ([]netlink.Message, error) {
	if len(req) == 0 {
		return nil, nil
	}
	if err := checkLibBatch(req); err != nil {
		if e.err == nil {
			e.err = err
		}
		return nil, nil
	}
	e.msgs = append(e.msgs, req[1:len(req)-1]...)
	return nil, nil
}

// checkLibBatch checks the framing the batch's copy depends on: begin and
// end around nftables messages that each start with their nfgenmsg header.
func checkLibBatch(req []netlink.Message) error {
	if len(req) < 2 || req[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN || req[len(req)-1].Header.Type != unix.NFNL_MSG_BATCH_END {
		return fmt.Errorf("google/nftables framed a batch of %d messages without batch begin and end: its encoding changed", len(req))
	}
	for _, m := range req[1 : len(req)-1] {
		if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
			return fmt.Errorf("google/nftables encoded message type %#x with %d bytes, not an nftables message: its encoding changed", uint16(m.Header.Type), len(m.Data))
		}
	}
	return nil
}

// encode returns the messages queued since the last encode, in order,
// without the batch's begin and end.
func (e *libEncoder) encode() ([]netlink.Message, error) {
	e.msgs, e.err = nil, nil
	if err := e.Flush(); err != nil {
		return nil, err
	}
	if e.err != nil {
		return nil, e.err
	}
	msgs := e.msgs
	e.msgs = nil
	return msgs, nil
}

// discard drops what is queued, after a queueing call failed: the library
// keeps the error, and Flush returns it without encoding anything.
func (e *libEncoder) discard() { _ = e.Flush() }
