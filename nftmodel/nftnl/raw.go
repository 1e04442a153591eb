package nftnl

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// RawBatch is a batch of objects described in the library's terms rather
// than the model's, for what no ruleset says: the kernel feature probes
// (package features) program single objects of the kinds nftproxy uses, and
// objects no ruleset has, to see the kernel refuse them. Its messages are
// encoded on a libEncoder and sent on a Conn's batch socket, as the
// applier's are.
type RawBatch struct {
	lib  *libEncoder
	msgs []netlink.Message // encoded so far, before what lib holds queued
}

// NewRawBatch returns an empty batch.
func NewRawBatch() *RawBatch { return &RawBatch{lib: newLibEncoder()} }

// Lib is where the batch's objects are queued (AddChain, AddRule, AddSet,
// …); it sends nothing.
func (b *RawBatch) Lib() *nftables.Conn { return b.lib.Conn }

// AddTable queues the table name of family f, owned by the socket that
// sends the batch when owned (Linux 5.12: the kernel deletes it when that
// socket closes), and returns it for the objects that go into it.
func (b *RawBatch) AddTable(f nftmodel.Family, name string, owned bool) *nftables.Table {
	t := &nftables.Table{Name: name, Family: libFamily(f)}
	if owned {
		t.Flags = nftables.TableFlagOwner
	}
	b.lib.AddTable(t)
	return t
}

// DelTable queues the deletion of the table name of family f.
func (b *RawBatch) DelTable(f nftmodel.Family, name string) {
	b.lib.DelTable(&nftables.Table{Name: name, Family: libFamily(f)})
}

// AddTypeofSet queues ls with its elements, declared with decl.Typeof
// (which must give decl's Key and Data types): the user data that nft
// writes for the declaration, which the library can't write, goes into the
// set's message.
func (b *RawBatch) AddTypeofSet(f nftmodel.Family, ls *nftables.Set, els []nftables.SetElement, decl *nftmodel.Set) error {
	u, err := typeofUserData(f, decl)
	if err != nil {
		return fmt.Errorf("add set %s: %w", ls.Name, err)
	}
	// Encode what is queued, so that the set's message comes first in
	// what is encoded next.
	if err := b.cut(); err != nil {
		return err
	}
	if err := b.lib.AddSet(ls, els); err != nil {
		b.lib.discard()
		return fmt.Errorf("add set %s: %w", ls.Name, err)
	}
	msgs, err := b.lib.encode()
	if err != nil {
		return fmt.Errorf("encode set %s: %w", ls.Name, err)
	}
	if len(msgs) == 0 {
		return fmt.Errorf("encode set %s: the library encoded no message", ls.Name)
	}
	if msgs[0].Data, err = withUserData(msgs[0].Data, u); err != nil {
		return fmt.Errorf("encode set %s: %w", ls.Name, err)
	}
	b.msgs = append(b.msgs, msgs...)
	return nil
}

// cut moves what the library holds queued into b.msgs.
func (b *RawBatch) cut() error {
	msgs, err := b.lib.encode()
	if err != nil {
		return fmt.Errorf("encode messages: %w", err)
	}
	b.msgs = append(b.msgs, msgs...)
	return nil
}

// Send sends the batch on conn's batch socket. When the kernel refuses a
// message the error is a *RefusedError naming it.
func (b *RawBatch) Send(conn *Conn) error {
	if err := b.cut(); err != nil {
		return err
	}
	msgs := b.msgs
	b.msgs = nil
	size := 2 * batchEdgeSize(0)
	for _, m := range msgs {
		size += nlmsgHeaderLen + align4(len(m.Data))
	}
	first := nextSeqs(len(msgs) + 2)
	w := &wire{buf: make([]byte, 0, size), seq: first}
	w.batchEdge(unix.NFNL_MSG_BATCH_BEGIN, 0)
	for _, m := range msgs {
		w.message(m)
	}
	w.batchEdge(unix.NFNL_MSG_BATCH_END, 0)
	refused, err := sendBatch(conn, w.buf, first, len(msgs)+2)
	if err != nil || refused == nil {
		return err
	}
	e := &RefusedError{Verb: "commit", Err: refused.errno}
	if i := int(refused.seq - first); i >= 1 && i <= len(msgs) {
		// The kernel answers a failed commit, and a batch begin it
		// refuses, with the begin's number.
		e.Verb, e.Family = describeRequest(msgs[i-1])
	}
	return e
}

// RefusedError is the kernel's refusal of a message of a RawBatch.
type RefusedError struct {
	// Verb says what the message asked: VerbAddTable, "add chain", …;
	// "commit" when the kernel refused the batch as a whole.
	Verb   string
	Family nftmodel.Family
	Err    unix.Errno
}

// VerbAddTable is the RefusedError.Verb of a refused table.
const VerbAddTable = "add table"

func (e *RefusedError) Error() string {
	if e.Verb == "commit" {
		return fmt.Sprintf("commit nftables batch: %v", e.Err)
	}
	return fmt.Sprintf("%s %s: %v", e.Verb, e.Family, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// describeRequest names the request of a message the library encoded.
func describeRequest(m netlink.Message) (string, nftmodel.Family) {
	f := nftmodel.IPv4
	if m.Data[0] == byte(nftables.TableFamilyIPv6) {
		f = nftmodel.IPv6
	}
	verb, ok := map[uint16]string{
		unix.NFT_MSG_NEWTABLE:   VerbAddTable,
		unix.NFT_MSG_DELTABLE:   "delete table",
		unix.NFT_MSG_NEWCHAIN:   "add chain",
		unix.NFT_MSG_NEWRULE:    "add rule",
		unix.NFT_MSG_NEWSET:     "add set",
		unix.NFT_MSG_NEWSETELEM: "add set elements",
	}[uint16(m.Header.Type)&0xff]
	if !ok {
		verb = fmt.Sprintf("message type %#x", uint16(m.Header.Type))
	}
	return verb, f
}
