package nftmodel

import (
	"net/netip"
	"slices"
	"time"
)

// Family is the address family of a table.
type Family uint8

const (
	IPv4 Family = iota
	IPv6
)

// String returns the nft family keyword.
func (f Family) String() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// Ruleset is one table: everything nftproxy owns in one family.
// Sets and Chains are kept in the order they are created in the kernel, which
// is also the order `nft list table` prints them in.
type Ruleset struct {
	Family Family
	Table  string
	Sets   []*Set
	Chains []*Chain
}

// ChainType is the type of a base chain.
type ChainType uint8

const (
	TypeFilter ChainType = iota
	TypeNAT
)

func (t ChainType) String() string {
	if t == TypeNAT {
		return "nat"
	}
	return "filter"
}

// Hook is a netfilter hook a base chain is attached to.
type Hook uint8

const (
	HookPrerouting Hook = iota
	HookInput
	HookForward
	HookOutput
	HookPostrouting
)

func (h Hook) String() string {
	return [...]string{"prerouting", "input", "forward", "output", "postrouting"}[h]
}

// BaseChain makes a chain a base chain: attached to a hook at a priority.
type BaseChain struct {
	Type     ChainType
	Hook     Hook
	Priority int32
}

// Chain is a chain with its rules in order.
type Chain struct {
	Name  string
	Base  *BaseChain // nil for a regular chain
	Rules []Rule
}

// Rule is a sequence of expressions evaluated left to right, with an optional
// comment (nftproxy puts namespace/name:port there).
type Rule struct {
	Exprs   []Expr
	Comment string
}

// Field is a packet or metadata field used in matches and set keys.
type Field uint8

const (
	FieldSaddr   Field = iota // ip saddr / ip6 saddr
	FieldDaddr                // ip daddr / ip6 daddr
	FieldL4Proto              // meta l4proto
	FieldTHDport              // th dport
	// The connection's addresses and ports as conntrack holds them, after
	// DNAT: the original destination (the service) and the reply's source
	// (the endpoint). nft types the ports only after a layer 4 protocol
	// match in the same rule.
	FieldCtOriginalDaddr    // ct original ip daddr
	FieldCtOriginalProtoDst // ct original proto-dst
	FieldCtReplySaddr       // ct reply ip saddr
	FieldCtReplyProtoSrc    // ct reply proto-src
)

// Expr is one expression of a rule. The set of expressions is closed: only the
// types in this package implement it.
type Expr interface{ isExpr() }

// MatchPrefix matches the source or destination address against a prefix
// (a full-length prefix matches one address).
type MatchPrefix struct {
	Field  Field // FieldSaddr or FieldDaddr
	Prefix netip.Prefix
	Negate bool
}

// MatchL4Proto matches the layer 4 protocol number.
type MatchL4Proto struct{ Proto uint8 }

// MatchMark matches whether any of the bits in Mask are set in the packet mark.
type MatchMark struct {
	Mask  uint32
	IsSet bool // true: meta mark & Mask != 0; false: == 0
}

// MatchFibDaddrLocal matches packets whose destination is a local address.
type MatchFibDaddrLocal struct{}

// MatchFibSaddrLocal matches packets whose source is a local address: the
// node's own traffic.
type MatchFibSaddrLocal struct{}

// MatchCtStateInvalid matches packets conntrack considers invalid.
type MatchCtStateInvalid struct{}

// Counter counts the packets and bytes that reach it: zero when written,
// the kernel's counts when read back.
type Counter struct{ Packets, Bytes uint64 }

// MatchCtStatusDNAT matches packets of connections that were DNATed (with
// Negate, of connections that were not).
type MatchCtStatusDNAT struct{ Negate bool }

// MatchCtStateEstablished matches packets of established or related
// connections (with Negate, of the others: new and invalid ones).
type MatchCtStateEstablished struct{ Negate bool }

// MatchIifname matches the name of the interface the packet came in on; a
// Name ending in "*" matches every name with that prefix.
type MatchIifname struct {
	Name   string
	Negate bool
}

// MatchSet matches when the concatenation of Key is an element of the named
// set (with Negate, when it is not).
type MatchSet struct {
	Key    []Field
	Set    string
	Negate bool
}

// VerdictMap looks the concatenation of Key up in a named verdict map and
// applies the verdict found; no verdict (continue) when the key is absent.
type VerdictMap struct {
	Key []Field
	Map string
}

// NumgenGoto picks one of Chains at random with equal probability
// (numgen random mod len(Chains)) and goes to it.
type NumgenGoto struct{ Chains []string }

// UpdateSet adds the concatenation of Key to a dynamic set with timeouts, or
// refreshes its timeout (session affinity).
type UpdateSet struct {
	Key []Field
	Set string
}

// UpdateMap adds the concatenation of Key, mapped to the concatenation of
// Data, to a dynamic map with timeouts, with the given Timeout; an element
// with that key already there keeps its value and has its timeout renewed
// (session affinity remembers a client's endpoint so).
type UpdateMap struct {
	Key     []Field
	Data    []Field
	Map     string
	Timeout time.Duration
}

// MarkOr sets bits in the packet mark.
type MarkOr struct{ Bits uint32 }

// MarkXor flips bits in the packet mark.
type MarkXor struct{ Bits uint32 }

// DNATMap rewrites the destination address and port to the value the named
// map holds for the concatenation of Key, followed, when Numgen > 0, by a
// random number below Numgen (numgen random mod Numgen): a map keyed that way
// holds one element per endpoint slot.
type DNATMap struct {
	Key    []Field
	Numgen uint32
	// Offset is added to the random number (numgen … offset Offset): a
	// second run of slots under the same key, such as a service's local
	// endpoints, starts there.
	Offset uint32
	Map    string
}

// DNAT rewrites the destination to Addr:Port for the protocol Proto.
type DNAT struct {
	Proto uint8
	Addr  netip.Addr
	Port  uint16
}

// Masquerade source-NATs to the outgoing interface's address.
type Masquerade struct{ FullyRandom bool }

// Reject refuses the packet: a TCP reset when TCPReset (TCP packets only),
// otherwise an ICMP port unreachable.
type Reject struct{ TCPReset bool }

// VerdictKind is the kind of a verdict.
type VerdictKind uint8

const (
	Accept VerdictKind = iota
	Drop
	Return
	Jump
	Goto
)

// Verdict ends or redirects rule evaluation.
type Verdict struct {
	Kind  VerdictKind
	Chain string // for Jump and Goto
}

func (MatchPrefix) isExpr()             {}
func (MatchL4Proto) isExpr()            {}
func (MatchMark) isExpr()               {}
func (MatchFibDaddrLocal) isExpr()      {}
func (MatchFibSaddrLocal) isExpr()      {}
func (UpdateSet) isExpr()               {}
func (UpdateMap) isExpr()               {}
func (MatchCtStateInvalid) isExpr()     {}
func (Counter) isExpr()                 {}
func (MatchCtStatusDNAT) isExpr()       {}
func (MatchCtStateEstablished) isExpr() {}
func (MatchIifname) isExpr()            {}
func (MatchSet) isExpr()                {}
func (VerdictMap) isExpr()              {}
func (NumgenGoto) isExpr()              {}
func (MarkOr) isExpr()                  {}
func (MarkXor) isExpr()                 {}
func (DNATMap) isExpr()                 {}
func (DNAT) isExpr()                    {}
func (Masquerade) isExpr()              {}
func (Reject) isExpr()                  {}
func (Verdict) isExpr()                 {}

// DataType is the type of one part of a set key or map value.
type DataType uint8

const (
	TypeIPv4Addr DataType = iota
	TypeIPv6Addr
	TypeInetProto
	TypeInetService
	TypeVerdict // only as the whole value of a verdict map
	// TypeInteger is a 32-bit number in host byte order, numgen's output.
	// nft can only declare it by expression: a set using it needs Typeof.
	TypeInteger
)

// Set is a named set (Data empty) or map (Data set). A verdict map has
// Data == []DataType{TypeVerdict}.
type Set struct {
	Name    string
	Key     []DataType
	Data    []DataType
	Typeof  *Typeof       // nil: declared by Key and Data (`type …`)
	Timeout time.Duration // default element timeout; 0 for none
	// Size bounds the elements of a set with a timeout, which the packet
	// path fills; 0 is nft's default, 65535. In any other set, 0 leaves the
	// elements unbounded (the kernel's resizable hash table); a bound gives
	// the set a hash table of fixed size, which the kernel fills with
	// fewer steps: adding more elements than Size fails.
	Size uint32
	// Interval makes the set hold ranges (nft's `flags interval`): each
	// element matches every key from Key to KeyEnd, part by part. Only
	// plain sets with a concatenated key (the kernel's pipapo) are used so.
	Interval bool
	Elements []Element
	// Source, when set, makes the set's elements instead of Elements (nil
	// then): a full sync encodes them into its batch one at a time, never
	// holding them all as a model. Readers that want them all call All.
	Source ElementSource
}

// ElementSource makes the elements of a set one at a time.
type ElementSource interface {
	Len() int
	// Element makes the i-th element in e, reusing the arrays of e's Key
	// and Data: a caller that keeps it must copy them.
	Element(i int, e *Element)
}

// Len is the number of the set's elements.
func (s *Set) Len() int {
	if s.Source != nil {
		return s.Source.Len()
	}
	return len(s.Elements)
}

// All returns the set's elements, made from its Source if it has one.
func (s *Set) All() []Element {
	if s.Source == nil {
		return s.Elements
	}
	n := s.Source.Len()
	out := make([]Element, n)
	var keys, data []Value
	for i := range out {
		if i == 1 {
			// Made into arrays sized by the first element, one for all
			// the keys and one for all the values: a source fills the
			// room it is given (a longer element gets its own array).
			keys = make([]Value, len(out[0].Key)*(n-1))
			data = make([]Value, len(out[0].Data)*(n-1))
		}
		if i > 0 {
			k, d := len(out[0].Key), len(out[0].Data)
			j := i - 1
			out[i].Key, out[i].Data = keys[j*k:j*k:(j+1)*k], data[j*d:j*d:(j+1)*d]
		}
		s.Source.Element(i, &out[i])
	}
	return out
}

// Materialized returns rs with every set's elements held in Elements: a
// copy when some set has a Source, else rs itself.
func Materialized(rs *Ruleset) *Ruleset {
	if !slices.ContainsFunc(rs.Sets, func(s *Set) bool { return s.Source != nil }) {
		return rs
	}
	out := *rs
	out.Sets = make([]*Set, len(rs.Sets))
	for i, s := range rs.Sets {
		c := *s
		c.Elements, c.Source = s.All(), nil
		out.Sets[i] = &c
	}
	return &out
}

// Typeof declares a set's key and value by the expressions that produce them
// (nft's `typeof`), as nft must for a key with a numgen part. The kernel
// stores the expressions as the set's user data, where nft reads them back
// to list the set; they must give the types Key and Data name.
type Typeof struct {
	Key []Field
	// KeyNumgen > 0 ends the key with `numgen random mod KeyNumgen`; in a
	// declaration the modulus only gives the part its type.
	KeyNumgen uint32
	Data      []Field
}

// Equal tells whether two declarations are the same (both may be nil).
func (t *Typeof) Equal(o *Typeof) bool {
	if t == nil || o == nil {
		return t == o
	}
	return slices.Equal(t.Key, o.Key) && t.KeyNumgen == o.KeyNumgen && slices.Equal(t.Data, o.Data)
}

// DefaultTimeoutSetSize is the size nft gives a set with a timeout unless
// told otherwise.
const DefaultTimeoutSetSize = 65535

// DeclaredSize is the size a set with a timeout is declared with.
func (s *Set) DeclaredSize() uint32 {
	if s.Size == 0 {
		return DefaultTimeoutSetSize
	}
	return s.Size
}

// IsVerdictMap tells whether the set maps keys to verdicts.
func (s *Set) IsVerdictMap() bool { return len(s.Data) == 1 && s.Data[0] == TypeVerdict }

// Value is one part of a concatenated key or value: an address for the
// address types, a number for protocols and ports.
type Value struct {
	Addr netip.Addr
	Num  uint32
}

// Contains tells whether an interval set's element holds key: every part
// lies between the element's Key and KeyEnd.
func (e Element) Contains(key []Value) bool {
	if len(key) != len(e.Key) {
		return false
	}
	end := e.KeyEnd
	if end == nil {
		end = e.Key
	}
	for i, v := range key {
		lo, hi := e.Key[i], end[i]
		if lo.Addr.IsValid() {
			a := v.Addr.Unmap()
			if a.Less(lo.Addr) || hi.Addr.Less(a) {
				return false
			}
			continue
		}
		if v.Num < lo.Num || v.Num > hi.Num {
			return false
		}
	}
	return true
}

// A returns an address value.
func A(a netip.Addr) Value { return Value{Addr: a} }

// N returns a numeric value (protocol number or port).
func N(n uint32) Value { return Value{Num: n} }

// Element is one element of a set or map. Data is the value of a data map;
// Verdict the value of a verdict map.
type Element struct {
	Key []Value
	// KeyEnd is the last key of an interval set's element; nil for one key
	// (and in every other set).
	KeyEnd  []Value
	Data    []Value
	Verdict *Verdict
	Comment string
}
