package nlfault

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
)

// Kind is a kind of fault.
type Kind int

const (
	// Refuse makes the kernel refuse message Index of the batch (0 is the
	// batch begin, whose subsystem is spoiled; any other gets a message
	// type nftables doesn't know).
	Refuse Kind = iota + 1
	// SendError fails the send with Errno; nothing reaches the kernel.
	SendError
	// LoseReplies sends the batch, then fails receiving its replies with
	// Errno, as a full receive buffer does (ENOBUFS): the kernel may have
	// committed it.
	LoseReplies
	// ShortRead refuses message Index and cuts the first reply in half.
	ShortRead
	// Stall holds the send until its deadline and fails it; nothing
	// reaches the kernel.
	Stall
)

func (k Kind) String() string {
	switch k {
	case Refuse:
		return "refuse"
	case SendError:
		return "send error"
	case LoseReplies:
		return "lose replies"
	case ShortRead:
		return "short read"
	case Stall:
		return "stall"
	}
	return fmt.Sprintf("kind %d", int(k))
}

// Fault is one fault, applied to one batch.
type Fault struct {
	Kind  Kind
	Index int        // Refuse, ShortRead: the message, 0 the batch begin
	Errno unix.Errno // SendError, LoseReplies
}

func (f Fault) String() string {
	switch f.Kind {
	case Refuse, ShortRead:
		return fmt.Sprintf("%s message %d", f.Kind, f.Index)
	case SendError, LoseReplies:
		return fmt.Sprintf("%s %s", f.Kind, unix.ErrnoName(f.Errno))
	}
	return f.Kind.String()
}

// Injector wraps a connection's batch sockets and applies the faults queued
// with Next, one per batch, in order; batches with none queued pass.
type Injector struct {
	mu      sync.Mutex
	queue   []Fault
	batches int
	types   []uint16
}

// Wrap makes every batch of conn go through a new Injector.
func Wrap(conn *nftnl.Conn) *Injector {
	in := &Injector{}
	conn.WrapBatches(func(s nftnl.BatchSocket) nftnl.BatchSocket { return &socket{BatchSocket: s, in: in} })
	return in
}

// Next queues f for the next batch without a fault queued.
func (in *Injector) Next(f Fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.queue = append(in.queue, f)
}

// Batches is how many batches were sent (or tried).
func (in *Injector) Batches() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.batches
}

// LastTypes returns the nfnetlink message types of the last batch, begin
// and end included.
func (in *Injector) LastTypes() []uint16 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]uint16(nil), in.types...)
}

// take records a batch and returns its fault, if any.
func (in *Injector) take(types []uint16) (Fault, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.batches++
	in.types = types
	if len(in.queue) == 0 {
		return Fault{}, false
	}
	f := in.queue[0]
	in.queue = in.queue[1:]
	return f, true
}

type socket struct {
	nftnl.BatchSocket
	in *Injector
	// receive fault of the batch in flight
	lose    unix.Errno
	cutNext bool
}

// unknownType is an nftables message type the kernel has no handler for.
const unknownType = unix.NFNL_SUBSYS_NFTABLES<<8 | 0xff

func (s *socket) Send(batch []byte, msgs int, deadline time.Time) error {
	s.lose, s.cutNext = 0, false
	offs := messageOffsets(batch)
	types := make([]uint16, len(offs))
	for i, o := range offs {
		types[i] = binary.NativeEndian.Uint16(batch[o+4:])
	}
	f, ok := s.in.take(types)
	if !ok {
		return s.BatchSocket.Send(batch, msgs, deadline)
	}
	switch f.Kind {
	case Refuse, ShortRead:
		if f.Index < 0 || f.Index >= len(offs) {
			return fmt.Errorf("nlfault: no message %d in a batch of %d", f.Index, len(offs))
		}
		batch = append([]byte(nil), batch...)
		o := offs[f.Index]
		if f.Index == 0 {
			// The begin's nfgenmsg names the subsystem: none has this ID.
			binary.BigEndian.PutUint16(batch[o+16+2:], 0xff)
		} else {
			binary.NativeEndian.PutUint16(batch[o+4:], unknownType)
		}
		s.cutNext = f.Kind == ShortRead
		return s.BatchSocket.Send(batch, msgs, deadline)
	case SendError:
		return f.Errno
	case LoseReplies:
		s.lose = f.Errno
		return s.BatchSocket.Send(batch, msgs, deadline)
	case Stall:
		time.Sleep(time.Until(deadline))
		return os.ErrDeadlineExceeded
	}
	return fmt.Errorf("nlfault: unknown fault %v", f)
}

func (s *socket) Receive(buf []byte) (int, error) {
	if s.lose != 0 {
		// Drain what the kernel queued, as the overflow would have lost it.
		for {
			if _, err := s.BatchSocket.Receive(buf); err != nil {
				break
			}
		}
		err := s.lose
		s.lose = 0
		return 0, err
	}
	n, err := s.BatchSocket.Receive(buf)
	if err == nil && s.cutNext {
		s.cutNext = false
		n /= 2
	}
	return n, err
}

// messageOffsets returns where each netlink message of a batch starts.
func messageOffsets(b []byte) []int {
	var offs []int
	for o := 0; o+16 <= len(b); {
		offs = append(offs, o)
		l := int(binary.NativeEndian.Uint32(b[o:]))
		if l < 16 {
			break
		}
		o += (l + 3) &^ 3
	}
	return offs
}
