package features

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// answerTimeout bounds the wait for the kernel's answers to one batch; the
// kernel answers before SendMessages returns, so it is only a safety net.
const answerTimeout = 5 * time.Second

// build is one family's probe table while a feature programs it.
type build struct {
	c      *nftables.Conn // encodes messages; sends nothing
	t      *nftables.Table
	family nftables.TableFamily
	// userData replaces the user data the library writes for the named
	// sets: typeof declarations, which the library can't write.
	userData map[string][]byte
}

// programTable commits, in one batch, a probe table per family with what
// program queues into it, then deletes the tables in a second batch: the
// kernel checks hooks and jumps when a batch commits, and skips those checks
// for a table deleted in the same batch. The tables are owned by the
// probe's netlink socket where the kernel can (Linux 5.12), so that even a
// prober killed between the two batches leaves nothing behind. keep leaves
// the tables in place, unowned (tests list them).
func (p *Prober) programTable(name string, program func(*build) error, keep bool) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: p.netns})
	if err != nil {
		return fmt.Errorf("dial nftables netlink: %w", err)
	}
	defer func() { _ = conn.Close() }()
	// The kernel's reason, where it gives one, goes into the error.
	_ = conn.SetOption(netlink.ExtendedAcknowledge, true)

	owned := !keep && !p.noOwner
	msgs, err := p.encode(name, owned, program)
	if err != nil {
		return err
	}
	failed, err := send(conn, msgs)
	if err != nil && owned && failed >= 0 && isNewTable(msgs[failed]) &&
		(errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
		// A kernel before 5.12 knows no owner flag (and says EINVAL
		// before 5.10 or so): probe without it.
		p.noOwner, owned = true, false
		if msgs, err = p.encode(name, owned, program); err != nil {
			return err
		}
		_, err = send(conn, msgs)
	}
	if err != nil || keep {
		return err
	}
	del, err := p.encode(name, owned, nil)
	if err != nil {
		return err
	}
	if _, err := send(conn, del); err != nil {
		return fmt.Errorf("delete probe table %s: %w", name, err)
	}
	return nil
}

// tableName returns a table name no other probe, here or in another
// process, uses.
func (p *Prober) tableName() string {
	p.tables++
	return fmt.Sprintf("nftproxy-probe-%d-%d", os.Getpid(), p.tables)
}

// encode returns the batch that adds the probe table of every family with
// what program queues, or, with a nil program, the batch that deletes them.
func (p *Prober) encode(name string, owned bool, program func(*build) error) ([]netlink.Message, error) {
	var captured []netlink.Message
	lib, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		captured = append(captured, req...)
		return nil, nil
	}))
	if err != nil {
		return nil, fmt.Errorf("encode probe batch: %w", err)
	}
	userData := map[string][]byte{}
	for _, fam := range p.families {
		t := &nftables.Table{Name: name, Family: fam}
		if owned {
			t.Flags = nftables.TableFlagOwner
		}
		if program == nil {
			lib.DelTable(t)
			continue
		}
		lib.AddTable(t)
		b := &build{c: lib, t: t, family: fam, userData: map[string][]byte{}}
		if err := program(b); err != nil {
			return nil, fmt.Errorf("encode probe batch: %w", err)
		}
		for set, u := range b.userData {
			userData[fmt.Sprint(fam, "/", set)] = u
		}
	}
	if err := lib.Flush(); err != nil {
		return nil, fmt.Errorf("encode probe batch: %w", err)
	}
	for i, m := range captured {
		// The sending socket measures and numbers the messages itself;
		// every message but the batch's begin and end asks for an answer,
		// so that send knows when the kernel is done with the batch.
		captured[i].Header.Length, captured[i].Header.Sequence, captured[i].Header.PID = 0, 0, 0
		if t := m.Header.Type; t != unix.NFNL_MSG_BATCH_BEGIN && t != unix.NFNL_MSG_BATCH_END {
			captured[i].Header.Flags |= netlink.Acknowledge
		}
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET) || len(m.Data) < 4 {
			continue
		}
		set, ok := stringAttr(m.Data[4:], unix.NFTA_SET_NAME)
		u, patch := userData[fmt.Sprint(nftables.TableFamily(m.Data[0]), "/", set)]
		if !ok || !patch {
			continue
		}
		if captured[i].Data, err = withUserData(m.Data, u); err != nil {
			return nil, fmt.Errorf("encode probe set %s: %w", set, err)
		}
	}
	return captured, nil
}

// send sends one batch and reads the kernel's answer to each message. It
// returns the first error the kernel reported and the index of the message
// it answered (-1 when the error is not the kernel's answer to a message).
func send(conn *netlink.Conn, msgs []netlink.Message) (int, error) {
	sent, err := conn.SendMessages(msgs)
	if err != nil {
		return -1, fmt.Errorf("send probe batch: %w", err)
	}
	bySeq := make(map[uint32]int, len(sent))
	pending := 0
	for i, m := range sent {
		bySeq[m.Header.Sequence] = i
		if m.Header.Flags&netlink.Acknowledge != 0 {
			pending++
		}
	}
	if err := conn.SetReadDeadline(time.Now().Add(answerTimeout)); err != nil {
		return -1, fmt.Errorf("set probe read deadline: %w", err)
	}
	failed, first := -1, error(nil)
	for pending > 0 {
		replies, err := conn.Receive()
		var op *netlink.OpError
		if err != nil && errors.As(err, &op) && op.Sequence != 0 {
			i, ok := bySeq[op.Sequence]
			if !ok {
				return -1, fmt.Errorf("receive probe answer: %w", err)
			}
			if first == nil {
				failed, first = i, fmt.Errorf("%s: %w", describe(sent[i]), withReason(err, op))
			}
			if sent[i].Header.Flags&netlink.Acknowledge == 0 {
				break // the batch itself was refused: no more answers come
			}
			pending--
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("receive probe answer: %w", err)
		}
		for _, r := range replies {
			if r.Header.Type == netlink.Error {
				pending--
			}
		}
	}
	return failed, first
}

// withReason is the kernel's answer: the error number, after the reason
// of an extended acknowledgement when the kernel gave one.
func withReason(err error, op *netlink.OpError) error {
	if op.Err != nil {
		err = op.Err
	}
	if op.Message == "" {
		return err
	}
	return fmt.Errorf("%s: %w", op.Message, err)
}

func isNewTable(m netlink.Message) bool {
	return m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWTABLE)
}

// describe names a batch message for errors: its verb and family.
func describe(m netlink.Message) string {
	verb := map[uint16]string{
		unix.NFT_MSG_NEWTABLE:   "add table",
		unix.NFT_MSG_DELTABLE:   "delete table",
		unix.NFT_MSG_NEWCHAIN:   "add chain",
		unix.NFT_MSG_NEWRULE:    "add rule",
		unix.NFT_MSG_NEWSET:     "add set",
		unix.NFT_MSG_NEWSETELEM: "add set elements",
	}[uint16(m.Header.Type)&0xff]
	if uint16(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || verb == "" {
		return "nftables batch"
	}
	if len(m.Data) > 0 {
		verb += " " + familyName(nftables.TableFamily(m.Data[0]))
	}
	return verb
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family %d", f)
}
