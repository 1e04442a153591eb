// Element sources: the endpoint maps' and address sets' elements, made while a full apply encodes its batch.

package proxier

import (
	"net/netip"
	"slices"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// runSource makes the elements of an endpoint map at a full sync: the
// pieces' own elements of it, then every slot of every run.
type runSource struct {
	fixed []m.Element
	runs  []slotRun
	ends  []int // ends[i] is the number of elements up to the end of runs[i]
	// at is the run of the last element made: the batch asks for them in
	// order, so most calls find theirs without a search.
	at int
}

func newRunSource(fixed []m.Element, runs []slotRun) *runSource {
	s := &runSource{fixed: fixed, runs: runs, ends: make([]int, len(runs))}
	n := len(fixed)
	for i, r := range runs {
		n += r.eps.len()
		s.ends[i] = n
	}
	return s
}

func (s *runSource) Len() int {
	if len(s.ends) == 0 {
		return len(s.fixed)
	}
	return s.ends[len(s.ends)-1]
}

func (s *runSource) Element(i int, e *m.Element) {
	if i < len(s.fixed) {
		f := &s.fixed[i]
		*e = m.Element{Key: append(e.Key[:0], f.Key...), Data: append(e.Data[:0], f.Data...), Verdict: f.Verdict, Comment: f.Comment}
		return
	}
	j := s.at
	if !s.within(i, j) {
		j, _ = slices.BinarySearch(s.ends, i+1)
		s.at = j
	}
	r := &s.runs[j]
	if cap(e.Key) < len(r.key)+1 {
		e.Key = make([]m.Value, len(r.key)+1)
	}
	if cap(e.Data) < 2 {
		e.Data = make([]m.Value, 2)
	}
	*e = r.element(i-s.start(j), e.Key, e.Data)
}

// start is the number of the first element of run j.
func (s *runSource) start(j int) int {
	if j > 0 {
		return s.ends[j-1]
	}
	return len(s.fixed)
}

// within tells whether element i (past the fixed ones) is in run j.
func (s *runSource) within(i, j int) bool {
	return j < len(s.ends) && i < s.ends[j] && i >= s.start(j)
}

// addrSource makes the elements of a set of addresses, each address once
// in parts parts (hairpin's pairs, the cluster IPs), in address order: a
// sort, not a map, is the cheap way to drop duplicates at a full sync's
// size.
type addrSource struct {
	addrs []netip.Addr // sorted, each once
	parts int
}

func (s addrSource) Len() int { return len(s.addrs) }

func (s addrSource) Element(i int, e *m.Element) {
	k := e.Key[:0]
	for range s.parts {
		k = append(k, m.A(s.addrs[i]))
	}
	*e = m.Element{Key: k}
}

func hairpinElement(a netip.Addr) m.Element   { return m.Element{Key: []m.Value{m.A(a), m.A(a)}} }
func clusterIPElement(a netip.Addr) m.Element { return m.Element{Key: []m.Value{m.A(a)}} }
