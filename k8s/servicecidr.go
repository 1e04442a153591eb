package k8s

import (
	"fmt"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// KindServiceCIDR names networking.k8s.io/v1 ServiceCIDR objects in errors.
const KindServiceCIDR = "ServiceCIDR"

// serviceCIDREntry is what the tracker keeps of a ServiceCIDR object.
type serviceCIDREntry struct {
	version  string
	prefixes []netip.Prefix
}

// SetServiceCIDR adds or updates a ServiceCIDR: the ranges ClusterIPs are
// allocated from. An invalid range is skipped with a problem reported.
func (t *Tracker) SetServiceCIDR(obj *networkingv1.ServiceCIDR) {
	t.update(func(b *batch) {
		old := t.serviceCIDRs[obj.Name]
		if old != nil && sameVersion(old.version, obj.ResourceVersion) {
			return
		}
		prefixes, errs := ServiceCIDRFrom(obj)
		b.problems = append(b.problems, errs...)
		if t.serviceCIDRs == nil {
			t.serviceCIDRs = map[string]*serviceCIDREntry{}
		}
		t.serviceCIDRs[obj.Name] = &serviceCIDREntry{version: obj.ResourceVersion, prefixes: prefixes}
		if old == nil || !slices.Equal(old.prefixes, prefixes) {
			b.changed = true
		}
	})
}

// DeleteServiceCIDR removes a ServiceCIDR.
func (t *Tracker) DeleteServiceCIDR(name string) {
	t.update(func(b *batch) {
		if _, ok := t.serviceCIDRs[name]; ok {
			delete(t.serviceCIDRs, name)
			b.changed = true
		}
	})
}

// ServiceCIDRFrom converts a ServiceCIDR's ranges, masked; invalid ones are
// left out and reported.
func ServiceCIDRFrom(obj *networkingv1.ServiceCIDR) ([]netip.Prefix, []error) {
	var out []netip.Prefix
	var errs []error
	for i, s := range obj.Spec.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, &ObjectError{Kind: KindServiceCIDR, Name: obj.Name, Field: fmt.Sprintf("spec.cidrs[%d]", i),
				Skipped: "range " + s, Err: reasonf(ErrInvalidPrefix, "%q", s)})
			continue
		}
		out = append(out, p.Masked())
	}
	return out, errs
}

// allServiceCIDRs is the union of every ServiceCIDR's ranges, sorted, each
// once.
func (t *Tracker) allServiceCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, e := range t.serviceCIDRs {
		out = append(out, e.prefixes...)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
