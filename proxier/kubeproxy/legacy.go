package kubeproxy

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// The legacy iptables tables are x_tables blobs that the kernel hands out
// and takes back whole (IPT_SO_GET_ENTRIES, IPT_SO_SET_REPLACE): a run of
// entries, each a fixed header (struct ipt_entry or ip6t_entry), its
// matches and one target. A user chain is an ERROR entry naming it, its
// rules, and a RETURN; a built-in chain runs from its hook entry to its
// policy (underflow). Jumps are standard targets whose verdict is the byte
// offset of the chain's first rule. Removing entries means moving every
// offset behind them, and nothing else: the matches and targets are copied
// as they are, whatever their kind.

// xtLayout is where one family's entry header keeps what the pruning reads.
type xtLayout struct {
	family nftmodel.Family
	// entrySize is sizeof(struct ipt_entry) (ip6t_entry); targetOffset is
	// where its u16 target_offset is, next_offset right after it.
	entrySize, targetOffset int
	// countersAt is where its struct xt_counters (two u64) is.
	countersAt int
}

var (
	xtIPv4 = xtLayout{family: nftmodel.IPv4, entrySize: 112, targetOffset: 88, countersAt: 96}
	xtIPv6 = xtLayout{family: nftmodel.IPv6, entrySize: 168, targetOffset: 140, countersAt: 152}
)

// xtNumHooks is NF_INET_NUMHOOKS; the names are iptables' built-in chains.
const xtNumHooks = 5

var xtHookChains = [xtNumHooks]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// The fixed part of struct xt_entry_target: u16 size, name[29], revision;
// the data follows.
const (
	xtTargetHeader = 32
	xtTargetName   = 29
	xtErrorTarget  = "ERROR"
)

// xtTable is a legacy table as the kernel hands it out.
type xtTable struct {
	name       string
	validHooks uint32
	hookEntry  [xtNumHooks]uint32
	underflow  [xtNumHooks]uint32
	numEntries uint32
	entries    []byte
}

// xtEntry is one entry of a table's blob.
type xtEntry struct {
	off, size int
	chain     string // the chain it belongs to; "" for the table's end
	head      bool   // a user chain's ERROR entry
	jump      bool   // a standard target with a verdict that is an offset
	verdict   int32
}

func (l xtLayout) entries(t xtTable) ([]xtEntry, error) {
	hooks := map[int]string{}
	for h := range xtNumHooks {
		if t.validHooks&(1<<h) != 0 {
			hooks[int(t.hookEntry[h])] = xtHookChains[h]
		}
	}
	var out []xtEntry
	chain := ""
	b := t.entries
	for off := 0; off < len(b); {
		if off+l.entrySize > len(b) {
			return nil, fmt.Errorf("read %s: entry at %d runs past the table", t.name, off)
		}
		targetOff := int(binary.NativeEndian.Uint16(b[off+l.targetOffset:]))
		next := int(binary.NativeEndian.Uint16(b[off+l.targetOffset+2:]))
		if next < l.entrySize || off+next > len(b) || targetOff < l.entrySize || targetOff+xtTargetHeader > next {
			return nil, fmt.Errorf("read %s: entry at %d has offsets %d/%d", t.name, off, targetOff, next)
		}
		e := xtEntry{off: off, size: next}
		if name, ok := hooks[off]; ok {
			chain = name
		}
		target := b[off+targetOff : off+next]
		name := cString(target[2 : 2+xtTargetName])
		data := target[xtTargetHeader:]
		switch {
		case name == xtErrorTarget:
			chain, e.head = cString(data), true
			if chain == xtErrorTarget {
				chain, e.head = "", false // the table's end
			}
		case name == "" && len(data) >= 4:
			e.verdict = int32(binary.NativeEndian.Uint32(data))
			e.jump = e.verdict >= 0
		}
		e.chain = chain
		out = append(out, e)
		off += next
	}
	if uint32(len(out)) != t.numEntries {
		return nil, fmt.Errorf("read %s: %d entries, the kernel counts %d", t.name, len(out), t.numEntries)
	}
	return out, nil
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// xtPruned is a table without kube-proxy's chains.
type xtPruned struct {
	table xtTable
	// kept are the old indices of the entries it keeps, in order: whose
	// counters go back on them.
	kept    []int
	removed []string // "table/chain"
}

// pruneKubeProxy removes kube-proxy's chains (IsChain) from t, and the
// rules of other chains that jump or go to them (both are standard targets
// with the chain's offset; goto is a flag of the rule). It returns nil when
// t has none.
func (l xtLayout) pruneKubeProxy(t xtTable) (*xtPruned, error) {
	entries, err := l.entries(t)
	if err != nil {
		return nil, err
	}
	// A jump lands on the entry after the chain's ERROR entry.
	targets := map[int32]bool{}
	p := &xtPruned{}
	for _, e := range entries {
		if e.head && IsChain(e.chain) {
			targets[int32(e.off+e.size)] = true
			p.removed = append(p.removed, t.name+"/"+e.chain)
		}
	}
	if len(p.removed) == 0 {
		return nil, nil
	}
	drop := func(e xtEntry) bool { return IsChain(e.chain) || (e.jump && targets[e.verdict]) }
	// An offset o moves to o minus the bytes dropped before o; a hook
	// that began on a dropped rule begins on the next one kept.
	moved := map[int]int{}
	dropped := 0
	for _, e := range entries {
		moved[e.off] = e.off - dropped
		if drop(e) {
			dropped += e.size
		}
	}
	moved[len(t.entries)] = len(t.entries) - dropped
	out := xtTable{name: t.name, validHooks: t.validHooks, entries: make([]byte, 0, len(t.entries)-dropped)}
	for i, e := range entries {
		if drop(e) {
			continue
		}
		b := bytes.Clone(t.entries[e.off : e.off+e.size])
		if e.jump {
			to, ok := moved[int(e.verdict)]
			if !ok {
				return nil, fmt.Errorf("read %s: a rule of %s jumps to %d, no entry's offset", t.name, e.chain, e.verdict)
			}
			targetOff := int(binary.NativeEndian.Uint16(b[l.targetOffset:]))
			binary.NativeEndian.PutUint32(b[targetOff+xtTargetHeader:], uint32(to))
		}
		out.entries = append(out.entries, b...)
		p.kept = append(p.kept, i)
	}
	for h := range xtNumHooks {
		if t.validHooks&(1<<h) == 0 {
			continue
		}
		entry, ok1 := moved[int(t.hookEntry[h])]
		underflow, ok2 := moved[int(t.underflow[h])]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("read %s: %s begins or ends at no entry's offset", t.name, xtHookChains[h])
		}
		out.hookEntry[h], out.underflow[h] = uint32(entry), uint32(underflow)
	}
	out.numEntries = uint32(len(p.kept))
	p.table = out
	return p, nil
}

// counters are the packet and byte counters of t's entries whose old
// indices kept lists, as IPT_SO_SET_ADD_COUNTERS takes them.
func (l xtLayout) counters(t xtTable, kept []int) ([]byte, error) {
	entries, err := l.entries(t)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 16*len(kept))
	for _, i := range kept {
		at := entries[i].off + l.countersAt
		out = append(out, t.entries[at:at+16]...)
	}
	return out, nil
}
