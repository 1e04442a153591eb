package nftmodel

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
)

// nft declares a set with a timeout as `size 65535` and `flags dynamic,timeout`
// by default; Render prints that, so the applier declares the same.
const timeoutSetSize = 65535

// Element lists are split so that no message comes near the 64 KiB a netlink
// attribute length can describe: at most maxChunkElements elements and
// maxChunkBytes of encoded elements per message.
const (
	maxChunkElements = 500
	maxChunkBytes    = 32 << 10
	// libElemBatchSize is where google/nftables splits an element list by
	// itself; only anonymous sets, which can't be filled in chunks, reach it.
	libElemBatchSize = 1<<16 - 1 - 1024
)

func libType(t DataType) (nftables.SetDatatype, error) {
	switch t {
	case TypeIPv4Addr:
		return nftables.TypeIPAddr, nil
	case TypeIPv6Addr:
		return nftables.TypeIP6Addr, nil
	case TypeInetProto:
		return nftables.TypeInetProto, nil
	case TypeInetService:
		return nftables.TypeInetService, nil
	case TypeVerdict:
		return nftables.TypeVerdict, nil
	}
	return nftables.SetDatatype{}, fmt.Errorf("unknown data type %d", t)
}

// libTypes returns the library type of a key or value: the type itself or
// the concatenation of the parts.
func libTypes(ts []DataType) (nftables.SetDatatype, error) {
	if len(ts) == 0 {
		return nftables.SetDatatype{}, errors.New("no data type")
	}
	parts := make([]nftables.SetDatatype, len(ts))
	for i, t := range ts {
		lt, err := libType(t)
		if err != nil {
			return nftables.SetDatatype{}, err
		}
		parts[i] = lt
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return nftables.ConcatSetType(parts...)
}

// libSet returns the library's description of a named set, as nft 1.0.6
// declares it: no concatenation flag (nft sets that only on interval sets)
// and a big-endian key byte order for single-type keys.
func libSet(t *nftables.Table, s *Set) (*nftables.Set, error) {
	key, err := libTypes(s.Key)
	if err != nil {
		return nil, fmt.Errorf("declare set %s: %w", s.Name, err)
	}
	ls := &nftables.Set{Table: t, Name: s.Name, KeyType: key}
	if len(s.Key) == 1 {
		ls.KeyByteOrder = binaryutil.BigEndian
	}
	if len(s.Data) > 0 {
		if s.IsVerdictMap() {
			ls.DataType = nftables.TypeVerdict
		} else if ls.DataType, err = libTypes(s.Data); err != nil {
			return nil, fmt.Errorf("declare map %s: %w", s.Name, err)
		}
		ls.IsMap = true
	}
	if s.Timeout > 0 {
		ls.HasTimeout = true
		ls.Timeout = s.Timeout
		ls.Dynamic = true
		ls.Size = timeoutSetSize
	}
	return ls, nil
}

// libElements encodes elements of a set with the given key and value types.
func libElements(key, data []DataType, verdicts bool, els []Element) ([]nftables.SetElement, error) {
	out := make([]nftables.SetElement, len(els))
	for i, e := range els {
		if len(e.Key) != len(key) {
			return nil, fmt.Errorf("encode element %d: key has %d parts, set key has %d", i, len(e.Key), len(key))
		}
		le := nftables.SetElement{Key: KeyBytes(key, e.Key), Comment: e.Comment}
		switch {
		case verdicts:
			if e.Verdict == nil {
				return nil, fmt.Errorf("encode element %s: verdict map element without verdict", renderValues(key, e.Key))
			}
			le.VerdictData = verdictExpr(*e.Verdict)
		case len(data) > 0:
			if len(e.Data) != len(data) {
				return nil, fmt.Errorf("encode element %s: value has %d parts, map value has %d", renderValues(key, e.Key), len(e.Data), len(data))
			}
			le.Val = KeyBytes(data, e.Data)
		}
		out[i] = le
	}
	return out, nil
}

// elementSize is the encoded size of one element in an element list, as
// google/nftables marshals it (attribute headers included).
func elementSize(e *nftables.SetElement) int {
	attr := func(n int) int { return 4 + (n+3)&^3 }
	n := attr(attr(len(e.Key))) // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }
	switch {
	case e.VerdictData != nil:
		v := attr(4) // NFTA_VERDICT_CODE
		if e.VerdictData.Chain != "" {
			v += attr(len(e.VerdictData.Chain) + 1)
		}
		n += attr(attr(v)) // NFTA_SET_ELEM_DATA { NFTA_DATA_VERDICT { ... } }
	case len(e.Val) > 0:
		n += attr(attr(len(e.Val)))
	}
	if e.Comment != "" {
		n += attr(2 + len(e.Comment) + 1) // userdata TLV with a NUL-terminated string
	}
	return attr(n) // the list element itself
}

// chunks splits elements into runs that each fit one message.
func chunks(els []nftables.SetElement, maxCount, maxBytes int) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	start, size := 0, 0
	for i := range els {
		n := elementSize(&els[i])
		if i > start && (i-start >= maxCount || size+n > maxBytes) {
			out = append(out, els[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(els) {
		out = append(out, els[start:])
	}
	return out
}

// anonMessages is how many element messages google/nftables makes for the
// elements of an anonymous set, which it splits by itself.
func anonMessages(els []nftables.SetElement) int {
	return len(chunks(els, len(els)+1, libElemBatchSize))
}
