package nftnl

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// nft declares a set with a timeout as `size 65535` and `flags dynamic,timeout`
// by default; Render prints that, so the applier declares the same.
const timeoutSetSize = nftmodel.DefaultTimeoutSetSize

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

func libType(t nftmodel.DataType) (nftables.SetDatatype, error) {
	switch t {
	case nftmodel.TypeIPv4Addr:
		return nftables.TypeIPAddr, nil
	case nftmodel.TypeIPv6Addr:
		return nftables.TypeIP6Addr, nil
	case nftmodel.TypeInetProto:
		return nftables.TypeInetProto, nil
	case nftmodel.TypeInetService:
		return nftables.TypeInetService, nil
	case nftmodel.TypeVerdict:
		return nftables.TypeVerdict, nil
	case nftmodel.TypeInteger:
		return nftables.TypeInteger, nil
	}
	return nftables.SetDatatype{}, fmt.Errorf("unknown data type %d", t)
}

// libTypes returns the library type of a key or value: the type itself or
// the concatenation of the parts.
func libTypes(ts []nftmodel.DataType) (nftables.SetDatatype, error) {
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
func libSet(t *nftables.Table, s *nftmodel.Set) (*nftables.Set, error) {
	key, err := libTypes(s.Key)
	if err != nil {
		return nil, fmt.Errorf("declare set %s: %w", s.Name, err)
	}
	if s.Typeof == nil && (slices.Contains(s.Key, nftmodel.TypeInteger) || slices.Contains(s.Data, nftmodel.TypeInteger)) {
		return nil, fmt.Errorf("declare set %s: an integer part needs a typeof declaration", s.Name)
	}
	ls := &nftables.Set{Table: t, Name: s.Name, KeyType: key}
	if len(s.Key) == 1 {
		ls.KeyByteOrder = binaryutil.BigEndian
	}
	if s.Interval && (len(s.Key) < 2 || len(s.Data) > 0 || s.Timeout > 0) {
		return nil, fmt.Errorf("declare set %s: only a plain set with a concatenated key holds ranges", s.Name)
	}
	if s.Interval {
		// As nft declares an interval set of concatenations: the concat
		// flag and the parts' lengths make the kernel pick pipapo.
		ls.Interval = true
		ls.Concatenation = len(s.Key) > 1
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
		ls.Size = s.DeclaredSize()
	} else {
		ls.Size = s.Size
	}
	return ls, nil
}

// elementEncoder checks and sizes a set's model elements for the wire (see
// wire.elements), from the set's types alone.
type elementEncoder struct {
	key, data        []nftmodel.DataType // data nil for deletions and plain sets
	verdicts         bool
	interval         bool // each element carries its last key (NFTA_SET_ELEM_KEY_END)
	keyLen, valueLen int  // encoded sizes, fixed by the types
}

func newElementEncoder(key, data []nftmodel.DataType, verdicts, interval bool) *elementEncoder {
	enc := &elementEncoder{key: key, data: data, verdicts: verdicts, interval: interval, keyLen: nftmodel.KeyLen(key)}
	if !verdicts {
		enc.valueLen = nftmodel.KeyLen(data)
	}
	return enc
}

// check finds what the wire encoding can't carry, or nft could not list.
func (enc *elementEncoder) check(e *nftmodel.Element) error {
	if err := checkValues(enc.key, e.Key); err != nil {
		return fmt.Errorf("encode element key: %w", err)
	}
	if e.KeyEnd != nil {
		if !enc.interval {
			return fmt.Errorf("encode element %s: a range in a set without intervals", nftmodel.RenderValues(enc.key, e.Key))
		}
		if err := checkValues(enc.key, e.KeyEnd); err != nil {
			return fmt.Errorf("encode element end: %w", err)
		}
	}
	if len(e.Comment) > maxCommentLen {
		return fmt.Errorf("encode element %s: comment longer than %d bytes", nftmodel.RenderValues(enc.key, e.Key), maxCommentLen)
	}
	switch {
	case enc.verdicts:
		if e.Verdict == nil {
			return fmt.Errorf("encode element %s: verdict map element without verdict", nftmodel.RenderValues(enc.key, e.Key))
		}
	case len(enc.data) > 0:
		if err := checkValues(enc.data, e.Data); err != nil {
			return fmt.Errorf("encode element %s: value: %w", nftmodel.RenderValues(enc.key, e.Key), err)
		}
	}
	return nil
}

func checkValues(ts []nftmodel.DataType, vs []nftmodel.Value) error {
	if len(vs) != len(ts) {
		return fmt.Errorf("%d parts, the set's type has %d", len(vs), len(ts))
	}
	for i, t := range ts {
		if t == nftmodel.TypeIPv4Addr && !vs[i].Addr.Is4() || t == nftmodel.TypeIPv6Addr && !vs[i].Addr.Is6() {
			return fmt.Errorf("part %d: %v is not an address of type %v", i+1, vs[i].Addr, t)
		}
	}
	return nil
}

// size is the encoded size of a checked element, from the set's types.
func (enc *elementEncoder) size(e *nftmodel.Element) int {
	end := 0
	if enc.interval {
		end = attrSize(attrSize(enc.keyLen)) // NFTA_SET_ELEM_KEY_END { NFTA_DATA_VALUE }
	}
	return end + enc.sizeWithoutEnd(e)
}

func (enc *elementEncoder) sizeWithoutEnd(e *nftmodel.Element) int {
	switch {
	case enc.verdicts:
		chain := ""
		if e.Verdict.Kind == nftmodel.Jump || e.Verdict.Kind == nftmodel.Goto {
			chain = e.Verdict.Chain
		}
		return encodedElementSize(enc.keyLen, 0, true, chain, e.Comment)
	case len(enc.data) > 0:
		return encodedElementSize(enc.keyLen, enc.valueLen, false, "", e.Comment)
	}
	return encodedElementSize(enc.keyLen, 0, false, "", e.Comment)
}

// elementSize is the encoded size of one element in an element list, as
// google/nftables marshals it (attribute headers included).
func elementSize(e *nftables.SetElement) int {
	chain := ""
	if e.VerdictData != nil {
		chain = e.VerdictData.Chain
	}
	return encodedElementSize(len(e.Key), len(e.Val), e.VerdictData != nil, chain, e.Comment)
}

// encodedElementSize is the size of an element with a key and a value of
// the given lengths, or a verdict (to chain, if not empty), and a comment.
func encodedElementSize(keyLen, valueLen int, verdict bool, chain, comment string) int {
	attr := func(n int) int { return 4 + (n+3)&^3 }
	n := attr(attr(keyLen)) // NFTA_SET_ELEM_KEY { NFTA_DATA_VALUE }
	switch {
	case verdict:
		v := attr(4) // NFTA_VERDICT_CODE
		if chain != "" {
			v += attr(len(chain) + 1)
		}
		n += attr(attr(v)) // NFTA_SET_ELEM_DATA { NFTA_DATA_VERDICT { ... } }
	case valueLen > 0:
		n += attr(attr(valueLen))
	}
	if comment != "" {
		n += attr(2 + len(comment) + 1) // userdata TLV with a NUL-terminated string
	}
	return attr(n) // the list element itself
}

// chunks splits elements into runs that each fit one message.
func chunks(els []nftables.SetElement, maxCount, maxBytes int) [][]nftables.SetElement {
	return splitChunks(els, elementSize, maxCount, maxBytes)
}

// splitChunks splits els into runs of at most maxCount elements and at most
// maxBytes of encoded size each (a single larger element makes a run alone).
func splitChunks[E any](els []E, size func(*E) int, maxCount, maxBytes int) [][]E {
	var out [][]E
	start, total := 0, 0
	for i := range els {
		n := size(&els[i])
		if i > start && (i-start >= maxCount || total+n > maxBytes) {
			out = append(out, els[start:i])
			start, total = i, 0
		}
		total += n
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
