package nftmodel

import (
	"slices"
)

// Diff computes the changes that turn applied into desired. It reports false
// when the change can't be expressed incrementally (another family or table, or
// a set or base chain whose type changed); the caller then applies desired in
// full.
func Diff(applied, desired *Ruleset) (Changes, bool) {
	var c Changes
	if applied.Family != desired.Family || applied.Table != desired.Table {
		return c, false
	}
	if !diffSets(&c, applied, desired) || !diffChains(&c, applied, desired) {
		return Changes{}, false
	}
	return c, true
}

func diffSets(c *Changes, applied, desired *Ruleset) bool {
	old := make(map[string]*Set, len(applied.Sets))
	for _, s := range applied.Sets {
		old[s.Name] = s
	}
	for _, s := range desired.Sets {
		o, ok := old[s.Name]
		if !ok {
			c.AddSets = append(c.AddSets, s)
			continue
		}
		delete(old, s.Name)
		if !slices.Equal(o.Key, s.Key) || !slices.Equal(o.Data, s.Data) || o.Timeout != s.Timeout || o.Size != s.Size || o.Interval != s.Interval || !o.Typeof.Equal(s.Typeof) {
			return false
		}
		del, add := diffElements(o, s)
		if len(del) > 0 {
			c.DelElements = append(c.DelElements, SetElements{Set: s.Name, Key: s.Key, Data: s.Data, Timeout: s.Timeout, Interval: s.Interval, Elements: del})
		}
		if len(add) > 0 {
			c.AddElements = append(c.AddElements, SetElements{Set: s.Name, Key: s.Key, Data: s.Data, Timeout: s.Timeout, Interval: s.Interval, Elements: add})
		}
	}
	for _, s := range applied.Sets {
		if _, gone := old[s.Name]; gone {
			c.DelSets = append(c.DelSets, s.Name)
		}
	}
	return true
}

// diffElements returns the elements to delete and to add. An element whose key
// stays but whose value or comment changes is deleted and added again.
func diffElements(applied, desired *Set) (del, add []Element) {
	appliedEls, desiredEls := applied.All(), desired.All()
	old := make(map[string]Element, len(appliedEls))
	for _, e := range appliedEls {
		old[string(KeyBytes(applied.Key, e.Key))] = e
	}
	for _, e := range desiredEls {
		k := string(KeyBytes(desired.Key, e.Key))
		o, ok := old[k]
		if ok {
			delete(old, k)
			if elementEqual(desired, o, e) {
				continue
			}
			del = append(del, o)
		}
		add = append(add, e)
	}
	for _, e := range appliedEls {
		if o, gone := old[string(KeyBytes(applied.Key, e.Key))]; gone {
			del = append(del, o)
		}
	}
	return del, add
}

func elementEqual(s *Set, a, b Element) bool {
	return renderElement(s, a) == renderElement(s, b)
}

func diffChains(c *Changes, applied, desired *Ruleset) bool {
	old := make(map[string]*Chain, len(applied.Chains))
	for _, ch := range applied.Chains {
		old[ch.Name] = ch
	}
	for _, ch := range desired.Chains {
		o, ok := old[ch.Name]
		if !ok {
			c.AddChains = append(c.AddChains, ch)
			c.RewriteChains = append(c.RewriteChains, ch)
			continue
		}
		delete(old, ch.Name)
		if (o.Base == nil) != (ch.Base == nil) || (o.Base != nil && *o.Base != *ch.Base) {
			return false
		}
		if !rulesEqual(applied.Family, o.Rules, ch.Rules) {
			c.RewriteChains = append(c.RewriteChains, ch)
		}
	}
	for _, ch := range applied.Chains {
		if _, gone := old[ch.Name]; gone {
			c.DelChains = append(c.DelChains, ch.Name)
		}
	}
	return true
}

func rulesEqual(f Family, a, b []Rule) bool {
	return slices.EqualFunc(a, b, func(x, y Rule) bool { return RenderRule(f, x) == RenderRule(f, y) })
}
