package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// A batch goes to the kernel as one buffer written here, not through
// google/nftables' Flush: that keeps every encoded message until the send
// and then copies them all into a growing buffer, which at 400,000 set
// elements costs the sync about twice the batch's size in memory. Here the
// buffer is sized up front, set elements are encoded straight into it, and
// google/nftables encodes the rest (tables, chains, rules, sets), whose
// messages are copied in. The element encoding is the library's, byte for
// byte (TestWireElementsMatchLibrary).

// Netlink's framing: a 16-byte message header, 4-byte attribute headers,
// everything padded to 4 bytes.
const (
	nlmsgHeaderLen = 16
	attrHeaderLen  = 4
)

func align4(n int) int { return (n + 3) &^ 3 }

// attrSize is the size of an attribute with n bytes of payload, padded.
func attrSize(n int) int { return attrHeaderLen + align4(n) }

// batchSeq numbers the messages of the batches this process sends; the
// kernel names a refused message by its number. A random start keeps two
// processes' numbers apart in traces.
var batchSeq atomic.Uint32

func init() { batchSeq.Store(rand.Uint32()) }

// nextSeqs reserves n consecutive sequence numbers and returns the first.
func nextSeqs(n int) uint32 { return batchSeq.Add(uint32(n)) - uint32(n) + 1 }

// wire is a batch being written into one buffer.
type wire struct {
	buf []byte
	seq uint32 // the next message's number in the batch, from 0 (see number)
}

// beginMsg starts a message; endMsg sets its length.
func (w *wire) beginMsg(typ netlink.HeaderType, flags netlink.HeaderFlags) int {
	start := len(w.buf)
	w.buf = binary.NativeEndian.AppendUint32(w.buf, 0)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, uint16(typ))
	w.buf = binary.NativeEndian.AppendUint16(w.buf, uint16(flags))
	w.buf = binary.NativeEndian.AppendUint32(w.buf, w.seq)
	w.buf = binary.NativeEndian.AppendUint32(w.buf, 0) // port ID: the kernel knows the socket's
	w.seq++
	return start
}

func (w *wire) endMsg(start int) {
	w.pad()
	binary.NativeEndian.PutUint32(w.buf[start:], uint32(len(w.buf)-start))
}

// message copies a message google/nftables encoded, under our numbering.
func (w *wire) message(m netlink.Message) {
	start := w.beginMsg(m.Header.Type, m.Header.Flags)
	w.buf = append(w.buf, m.Data...)
	w.endMsg(start)
}

// nfgen writes the header every nfnetlink message starts with.
func (w *wire) nfgen(family uint8, resID uint16) {
	w.buf = append(w.buf, family, unix.NFNETLINK_V0)
	w.buf = binary.BigEndian.AppendUint16(w.buf, resID)
}

func (w *wire) pad() {
	for len(w.buf)%4 != 0 {
		w.buf = append(w.buf, 0)
	}
}

// beginAttr starts an attribute; endAttr sets its length (padding excluded,
// as netlink counts it) and pads.
func (w *wire) beginAttr(typ uint16) int {
	start := len(w.buf)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, 0)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, typ)
	return start
}

func (w *wire) endAttr(start int) {
	binary.NativeEndian.PutUint16(w.buf[start:], uint16(len(w.buf)-start))
	w.pad()
}

func (w *wire) attr(typ uint16, data ...byte) {
	start := w.beginAttr(typ)
	w.buf = append(w.buf, data...)
	w.endAttr(start)
}

func (w *wire) stringAttr(typ uint16, s string) {
	start := w.beginAttr(typ)
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, 0)
	w.endAttr(start)
}

// batchEdge writes the batch begin or end message; both carry the
// generation the batch was planned at, when guarded.
func (w *wire) batchEdge(typ netlink.HeaderType, genID uint32) {
	start := w.beginMsg(typ, netlink.Request)
	w.nfgen(0, unix.NFNL_SUBSYS_NFTABLES)
	if genID != 0 {
		w.attr(unix.NFNL_BATCH_GENID, binary.BigEndian.AppendUint32(nil, genID)...)
	}
	w.endMsg(start)
}

// batchEdgeSize is the size of batchEdge's message.
func batchEdgeSize(genID uint32) int {
	n := nlmsgHeaderLen + 4
	if genID != 0 {
		n += attrSize(4)
	}
	return n
}

// number gives the written messages consecutive sequence numbers from
// first: they were written numbered from 0, before their count was known.
func (w *wire) number(first uint32) {
	for at := 0; at+nlmsgHeaderLen <= len(w.buf); {
		seq := w.buf[at+8:]
		binary.NativeEndian.PutUint32(seq, first+binary.NativeEndian.Uint32(seq))
		at += align4(int(binary.NativeEndian.Uint32(w.buf[at:])))
	}
}

// elementsHeaderSize is the size of an element message without elements.
func elementsHeaderSize(set, table string) int {
	return nlmsgHeaderLen + 4 + attrSize(len(set)+1) + attrSize(4) + attrSize(len(table)+1) + attrHeaderLen
}

// sizeHint is about the size of the messages wire.elements writes for e:
// exact when every element encodes to the size of the first, as those of a
// full sync's sources do, so the batch's buffer needn't grow.
func (e *elementsStep) sizeHint(table string) int {
	n := e.src.Len()
	var el nftmodel.Element
	e.src.Element(0, &el)
	if e.enc.check(&el) != nil {
		return 0 // wire.elements fails on it
	}
	size := e.enc.size(&el)
	msgs := (n + maxChunkElements - 1) / maxChunkElements
	if perMsg := max(maxChunkBytes/max(size, 1), 1); perMsg < maxChunkElements {
		msgs = (n + perMsg - 1) / perMsg
	}
	return msgs*elementsHeaderSize(e.set.Name, table) + n*size
}

// elements writes the messages adding or deleting e's elements, as
// google/nftables' SetAddElements and SetDeleteElements encode them, each
// element made once, checked, and written straight into the batch. A message
// takes at most maxChunkElements elements and maxChunkBytes of them (a
// netlink attribute can't describe more than 64 KiB); chunk is told the
// elements of each. An element the wire can't carry fails the whole batch.
func (w *wire) elements(family nftmodel.Family, table string, e *elementsStep, chunk func(lo, hi int)) error {
	ls, enc := e.set, e.enc
	typ := unix.NFT_MSG_DELSETELEM
	if e.add {
		typ = unix.NFT_MSG_NEWSETELEM
	}
	var start, list, lo, bytes int
	open := false
	end := func(hi int) {
		w.endAttr(list)
		w.endMsg(start)
		chunk(lo, hi)
		open = false
	}
	var el nftmodel.Element
	n := e.src.Len()
	for i := range n {
		e.src.Element(i, &el)
		if err := enc.check(&el); err != nil {
			return fmt.Errorf("change elements of set %s: %w", ls.Name, err)
		}
		size := enc.size(&el)
		if open && (i-lo >= maxChunkElements || bytes+size > maxChunkBytes) {
			end(i)
		}
		if !open {
			// The library flags deletions with create too; the kernel ignores it.
			start = w.beginMsg(netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|typ), netlink.Request|netlink.Create)
			w.nfgen(uint8(libFamily(family)), 0)
			w.stringAttr(unix.NFTA_SET_ELEM_LIST_SET, ls.Name)
			w.attr(unix.NFTA_SET_ELEM_LIST_SET_ID, binary.BigEndian.AppendUint32(nil, ls.ID)...)
			w.stringAttr(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			list = w.beginAttr(unix.NFTA_SET_ELEM_LIST_ELEMENTS | unix.NLA_F_NESTED)
			lo, bytes, open = i, 0, true
		}
		w.element(uint16(i-lo+1), enc, &el)
		bytes += size
	}
	if open {
		end(n)
	}
	return nil
}

func (w *wire) element(index uint16, enc *elementEncoder, e *nftmodel.Element) {
	item := w.beginAttr(index | unix.NLA_F_NESTED)
	key := w.beginAttr(unix.NFTA_SET_ELEM_KEY | unix.NLA_F_NESTED)
	w.values(unix.NFTA_DATA_VALUE, enc.key, e.Key)
	w.endAttr(key)
	if enc.interval {
		// A single key is the range from itself to itself, as nft sends it.
		last := e.KeyEnd
		if last == nil {
			last = e.Key
		}
		end := w.beginAttr(nftables.NFTA_SET_ELEM_KEY_END | unix.NLA_F_NESTED)
		w.values(unix.NFTA_DATA_VALUE, enc.key, last)
		w.endAttr(end)
	}
	switch {
	case enc.verdicts:
		data := w.beginAttr(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
		verdict := w.beginAttr(unix.NFTA_DATA_VERDICT | unix.NLA_F_NESTED)
		kind, chain := verdictCode(*e.Verdict)
		// google/nftables writes the code as NFTA_DATA_VALUE and the chain
		// as NFTA_SET_ELEM_DATA; the kernel reads them as NFTA_VERDICT_CODE
		// and NFTA_VERDICT_CHAIN, which have the same numbers.
		w.attr(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(kind))...)
		if chain != "" {
			w.stringAttr(unix.NFTA_VERDICT_CHAIN, chain)
		}
		w.endAttr(verdict)
		w.endAttr(data)
	case len(enc.data) > 0:
		data := w.beginAttr(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
		w.values(unix.NFTA_DATA_VALUE, enc.data, e.Data)
		w.endAttr(data)
	}
	if e.Comment != "" {
		ud := w.beginAttr(unix.NFTA_SET_ELEM_USERDATA)
		w.buf = append(w.buf, byte(userdata.NFTNL_UDATA_SET_ELEM_COMMENT), byte(len(e.Comment)+1))
		w.buf = append(w.buf, e.Comment...)
		w.buf = append(w.buf, 0)
		w.endAttr(ud)
	}
	w.endAttr(item)
}

// values writes an attribute holding KeyBytes(types, vals).
func (w *wire) values(typ uint16, types []nftmodel.DataType, vals []nftmodel.Value) {
	start := w.beginAttr(typ)
	w.buf = nftmodel.AppendKeyBytes(w.buf, types, vals)
	w.endAttr(start)
}

// verdictCode is the kernel's code for a verdict, and the chain it names.
func verdictCode(v nftmodel.Verdict) (expr.VerdictKind, string) {
	switch v.Kind {
	case nftmodel.Accept:
		return expr.VerdictAccept, ""
	case nftmodel.Drop:
		return expr.VerdictDrop, ""
	case nftmodel.Return:
		return expr.VerdictReturn, ""
	case nftmodel.Jump:
		return expr.VerdictJump, v.Chain
	default:
		return expr.VerdictGoto, v.Chain
	}
}

func libFamily(f nftmodel.Family) nftables.TableFamily {
	if f == nftmodel.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// refusal is the kernel's answer to a batch that failed: the error of the
// first message it refused and that message's sequence number.
type refusal struct {
	seq   uint32
	errno unix.Errno
}

// sendBatch sends a written batch of msgs messages numbered from seq on
// conn's batch socket and returns the first refusal in the kernel's replies,
// if any. The kernel handles a batch while sendmsg runs, so every reply is
// queued when it returns. After any error the socket is dropped, so that
// replies left of this batch can't reach the next one.
func sendBatch(conn *Conn, buf []byte, seq uint32, msgs int) (*refusal, error) {
	conn.mu.Lock()
	defer conn.mu.Unlock()
	sock, err := conn.batchSocket()
	if err != nil {
		return nil, err
	}
	first, err := exchange(sock, buf, seq, msgs, time.Now().Add(conn.sendTimeout()))
	if err != nil {
		_ = sock.Close()
		conn.batches = nil
	}
	return first, err
}

func exchange(sock BatchSocket, buf []byte, seq uint32, msgs int, deadline time.Time) (*refusal, error) {
	if err := sock.Send(buf, msgs, deadline); err != nil {
		return nil, fmt.Errorf("send batch: %w", err)
	}
	var first *refusal
	rbuf := make([]byte, 64<<10)
	for {
		got, err := sock.Receive(rbuf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return first, nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// ENOBUFS: replies were dropped; the caller says what that means.
			return nil, fmt.Errorf("receive replies: %w", err)
		}
		replies, err := splitMessages(rbuf[:got])
		if err != nil {
			return nil, fmt.Errorf("parse replies: %w", err)
		}
		if r := firstRefusal(replies, seq, msgs); first == nil {
			first = r
		}
	}
}

// BatchSocket carries batches to the kernel and its replies back: the
// netfilter socket a Conn opens, or a test's wrapper around it that injects
// faults (Conn.WrapBatches).
type BatchSocket interface {
	// Send writes a batch of msgs messages as one datagram; it gives up at
	// deadline.
	Send(batch []byte, msgs int, deadline time.Time) error
	// Receive reads one datagram of replies into buf without waiting:
	// unix.EAGAIN when none is queued.
	Receive(buf []byte) (int, error)
	// PortID is the socket's netlink port ID, which the kernel's
	// notifications of the batches it committed carry.
	PortID() uint32
	Close() error
}

// netfilterSocket is the real BatchSocket.
type netfilterSocket struct{ c *netlink.Conn }

func (s netfilterSocket) Send(buf []byte, msgs int, deadline time.Time) error {
	// The kernel refuses a message longer than the send buffer; replies
	// (rules are echoed) get 1 KiB per message, as nft gives them.
	if err := s.c.SetWriteBuffer(len(buf) + 4096); err != nil {
		return fmt.Errorf("size send buffer: %w", err)
	}
	if err := s.c.SetReadBuffer(max(1<<20, msgs*1024)); err != nil {
		return fmt.Errorf("size receive buffer: %w", err)
	}
	if err := s.c.SetWriteDeadline(deadline); err != nil {
		return fmt.Errorf("set deadline: %w", err)
	}
	rc, err := s.c.SyscallConn()
	if err != nil {
		return fmt.Errorf("get raw socket: %w", err)
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	return serr
}

func (s netfilterSocket) Receive(buf []byte) (int, error) {
	rc, err := s.c.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("get raw socket: %w", err)
	}
	var got int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		// MSG_TRUNC: the datagram's length even when buf was too short.
		got, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		return true // never wait: what has not come is not coming
	}); err != nil {
		return 0, err
	}
	if rerr == nil && got > len(buf) {
		return 0, fmt.Errorf("reply of %d bytes truncated to %d", got, len(buf))
	}
	return got, rerr
}

func (s netfilterSocket) PortID() uint32 { return s.c.PID() }
func (s netfilterSocket) Close() error   { return s.c.Close() }

// dialNetfilterSocket opens a batch socket in the network namespace netnsFd
// (0 for the caller's own).
func dialNetfilterSocket(netnsFd int) (BatchSocket, error) {
	sock, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFd})
	if err != nil {
		return nil, fmt.Errorf("dial netfilter socket: %w", err)
	}
	// A refused message comes back without its payload (an element list
	// can be 32 KiB), so that many errors still fit the receive buffer.
	if err := sock.SetOption(netlink.CapAcknowledge, true); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("set netlink option: %w", err)
	}
	return netfilterSocket{sock}, nil
}

// batchSocket returns the batch socket, opening it the first time. The
// caller holds conn.mu.
func (c *Conn) batchSocket() (BatchSocket, error) {
	if c.batches != nil {
		return c.batches, nil
	}
	bs, err := c.open()
	if err != nil {
		return nil, err
	}
	if c.wrap != nil {
		bs = c.wrap(bs)
	}
	c.batches = bs
	c.ports = append(c.ports, bs.PortID())
	if len(c.ports) > maxPorts {
		c.ports = c.ports[1:]
	}
	return bs, nil
}

// maxPorts is how many of its batch sockets' port IDs a Conn remembers:
// the notifications of a closed socket's last commits may still be queued
// for a monitor when the next socket opens.
const maxPorts = 4

// firstRefusal finds the first error among replies to the batch of n
// messages numbered from seq; acknowledgements (error 0), echoed rules and
// replies to other batches are not.
func firstRefusal(replies []netlink.Message, seq uint32, n int) *refusal {
	for _, m := range replies {
		if m.Header.Type != netlink.Error || len(m.Data) < 4 || m.Header.Sequence-seq >= uint32(n) {
			continue
		}
		if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
			return &refusal{seq: m.Header.Sequence, errno: unix.Errno(-code)}
		}
	}
	return nil
}

// splitMessages splits a buffer into the netlink messages in it; their data
// points into b.
func splitMessages(b []byte) ([]netlink.Message, error) {
	var out []netlink.Message
	for len(b) > 0 {
		if len(b) < nlmsgHeaderLen {
			return nil, errors.New("split messages: short header")
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:min(align4(int(binary.NativeEndian.Uint32(b))), len(b))]); err != nil {
			return nil, fmt.Errorf("split messages: %w", err)
		}
		out = append(out, m)
		b = b[min(align4(int(m.Header.Length)), len(b)):]
	}
	return out, nil
}
