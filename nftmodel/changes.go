package nftmodel

import "time"

// Changes is what turns an applied ruleset into a desired one. The applier
// sends it as one batch in this order, so every reference is valid at each
// step: add sets, add chains, delete elements, rewrite chains (flush, then add
// their rules; chains about to be deleted are flushed too), add elements,
// delete sets, delete chains. Sets go before chains because a deleted verdict
// map may still point at a deleted chain.
type Changes struct {
	AddSets       []*Set   // new sets, with their elements
	AddChains     []*Chain // new chains; their rules are added in the rewrite step
	DelElements   []SetElements
	RewriteChains []*Chain // chains whose rules change (new chains included)
	AddElements   []SetElements
	DelChains     []string
	DelSets       []string
}

// SetElements names elements of one set, with the set's types so the
// applier needn't ask the kernel for them.
type SetElements struct {
	Set      string
	Key      []DataType
	Data     []DataType
	Timeout  time.Duration
	Interval bool // the set holds ranges: elements carry their KeyEnd
	Elements []Element
}

// Empty tells whether there is nothing to change.
func (c *Changes) Empty() bool {
	return len(c.AddSets) == 0 && len(c.AddChains) == 0 && len(c.DelElements) == 0 &&
		len(c.RewriteChains) == 0 && len(c.AddElements) == 0 && len(c.DelChains) == 0 && len(c.DelSets) == 0
}
