package kubeproxy

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestPruneRefusesMalformedTables: a blob the kernel would not hand out is
// an error, never a panic or a table written back.
func TestPruneRefusesMalformedTables(t *testing.T) {
	entry := func(l xtLayout, targetOff, next int) []byte {
		b := make([]byte, max(next, l.entrySize))
		binary.NativeEndian.PutUint16(b[l.targetOffset:], uint16(targetOff))
		binary.NativeEndian.PutUint16(b[l.targetOffset+2:], uint16(next))
		return b
	}
	for _, l := range []xtLayout{xtIPv4, xtIPv6} {
		for name, tab := range map[string]xtTable{
			"short":           {name: "nat", numEntries: 1, entries: make([]byte, l.entrySize-1)},
			"next offset 0":   {name: "nat", numEntries: 1, entries: entry(l, l.entrySize, 0)},
			"target past end": {name: "nat", numEntries: 1, entries: entry(l, l.entrySize+8, l.entrySize+16)},
			"count":           {name: "nat", numEntries: 2, entries: entry(l, l.entrySize, l.entrySize+40)},
		} {
			if _, err := l.pruneKubeProxy(tab); err == nil {
				t.Errorf("%s %s: no error", l.family, name)
			}
		}
		// Random bytes: errors or nothing to prune, never a panic.
		r := rand.New(rand.NewPCG(1, 2))
		for range 2000 {
			b := make([]byte, r.IntN(4*l.entrySize))
			for i := range b {
				b[i] = byte(r.UintN(256))
			}
			_, _ = l.pruneKubeProxy(xtTable{name: "nat", numEntries: r.Uint32N(4), validHooks: r.Uint32N(32), entries: b})
		}
	}
}
