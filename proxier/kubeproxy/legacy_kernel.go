package kubeproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// The socket options of <linux/netfilter_ipv4/ip_tables.h> (the IPv6 ones
// have the same numbers at SOL_IPV6), and the sizes of the structures they
// carry on 64-bit Linux.
const (
	xtSoGetInfo     = 64 // IPT_SO_GET_INFO
	xtSoGetEntries  = 65 // IPT_SO_GET_ENTRIES
	xtSoSetReplace  = 64 // IPT_SO_SET_REPLACE
	xtSoAddCounters = 65 // IPT_SO_SET_ADD_COUNTERS

	xtTableNameLen  = 32 // XT_TABLE_MAXNAMELEN
	xtGetInfoSize   = 84 // struct ipt_getinfo
	xtGetEntriesHdr = 40 // struct ipt_get_entries, before the entries
	xtReplaceHdr    = 96 // struct ipt_replace, before the entries
	xtCountersHdr   = 40 // struct xt_counters_info, before the counters
)

// xtSocket is a raw socket of the family, in the namespace of the calling
// thread, through which its legacy tables are read and replaced.
type xtSocket struct {
	fd    int
	level int
	l     xtLayout
}

func openXT(f nftmodel.Family) (*xtSocket, error) {
	domain, level, l := unix.AF_INET, unix.SOL_IP, xtIPv4
	if f == nftmodel.IPv6 {
		domain, level, l = unix.AF_INET6, unix.SOL_IPV6, xtIPv6
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("open raw socket: %w", err)
	}
	return &xtSocket{fd: fd, level: level, l: l}, nil
}

func (s *xtSocket) Close() error { return unix.Close(s.fd) }

func (s *xtSocket) getsockopt(opt int, buf []byte) error {
	n := uint32(len(buf))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), uintptr(s.level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func (s *xtSocket) setsockopt(opt int, buf []byte) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(s.fd), uintptr(s.level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func putName(b []byte, name string) { copy(b[:xtTableNameLen-1], name) }

// read is table name as the kernel has it now.
func (s *xtSocket) read(name string) (xtTable, error) {
	info := make([]byte, xtGetInfoSize)
	putName(info, name)
	if err := s.getsockopt(xtSoGetInfo, info); err != nil {
		return xtTable{}, fmt.Errorf("read legacy table %s: %w", name, err)
	}
	ne := binary.NativeEndian
	t := xtTable{name: name, validHooks: ne.Uint32(info[32:])}
	for h := range xtNumHooks {
		t.hookEntry[h] = ne.Uint32(info[36+4*h:])
		t.underflow[h] = ne.Uint32(info[56+4*h:])
	}
	t.numEntries = ne.Uint32(info[76:])
	size := ne.Uint32(info[80:])
	buf := make([]byte, xtGetEntriesHdr+int(size))
	putName(buf, name)
	ne.PutUint32(buf[32:], size)
	if err := s.getsockopt(xtSoGetEntries, buf); err != nil {
		return xtTable{}, fmt.Errorf("read legacy table %s: entries: %w", name, err)
	}
	t.entries = buf[xtGetEntriesHdr:]
	return t, nil
}

// replace swaps old for p's table in one call, which the kernel refuses
// (EAGAIN) if the table changed since old was read; then it puts the
// counters back on the entries kept, as iptables-restore does.
func (s *xtSocket) replace(old xtTable, p *xtPruned) error {
	ne := binary.NativeEndian
	t := p.table
	// The kernel writes the old table's counters here.
	oldCounters := make([]byte, 16*max(old.numEntries, 1))
	buf := make([]byte, xtReplaceHdr+len(t.entries))
	putName(buf, t.name)
	ne.PutUint32(buf[32:], t.validHooks)
	ne.PutUint32(buf[36:], t.numEntries)
	ne.PutUint32(buf[40:], uint32(len(t.entries)))
	for h := range xtNumHooks {
		ne.PutUint32(buf[44+4*h:], t.hookEntry[h])
		ne.PutUint32(buf[64+4*h:], t.underflow[h])
	}
	ne.PutUint32(buf[84:], old.numEntries)
	ne.PutUint64(buf[88:], uint64(uintptr(unsafe.Pointer(&oldCounters[0]))))
	copy(buf[xtReplaceHdr:], t.entries)
	err := s.setsockopt(xtSoSetReplace, buf)
	runtime.KeepAlive(oldCounters)
	if err != nil {
		return fmt.Errorf("replace legacy table %s: %w", t.name, err)
	}
	kept, err := s.l.counters(old, p.kept)
	if err != nil || len(kept) == 0 {
		return err
	}
	add := make([]byte, xtCountersHdr+len(kept))
	putName(add, t.name)
	ne.PutUint32(add[32:], t.numEntries)
	copy(add[xtCountersHdr:], kept)
	if err := s.setsockopt(xtSoAddCounters, add); err != nil {
		return fmt.Errorf("restore counters of legacy table %s: %w", t.name, err)
	}
	return nil
}

// pruneLegacy removes kube-proxy's chains from one loaded legacy table and
// returns them, as "table/chain". A table that changed under it is read
// again (another program wrote it between the read and the replace).
func pruneLegacy(f nftmodel.Family, table string) ([]string, error) {
	s, err := openXT(f)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	unlock := lockXTables()
	defer unlock()
	for attempt := 0; ; attempt++ {
		t, err := s.read(table)
		if err != nil {
			return nil, err
		}
		p, err := s.l.pruneKubeProxy(t)
		if err != nil || p == nil {
			return nil, err
		}
		err = s.replace(t, p)
		if errors.Is(err, unix.EAGAIN) && attempt < 5 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return p.removed, nil
	}
}

// lockXTables takes the lock iptables' legacy tools take (so that kubelet's
// or an operator's iptables does not write a table between the read and
// the replace), waiting up to 5 s, as `iptables --wait 5` would. Where the
// lock file cannot be opened (a read-only /run in a container) it goes on
// without: the kernel's EAGAIN still catches a change in the number of
// entries.
func lockXTables() (unlock func()) {
	path := os.Getenv("XTABLES_LOCKFILE")
	if path == "" {
		path = "/run/xtables.lock"
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return func() {}
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return func() { _ = f.Close() }
}
