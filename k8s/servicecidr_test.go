package k8s

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func serviceCIDR(name, rv string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

func TestTrackerServiceCIDRs(t *testing.T) {
	var invalid []error
	tr := NewTracker(nil, TrackerOptions{OnInvalid: func(_, _, _ string, err error) { invalid = append(invalid, err) }})
	prefixes := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	steps := []struct {
		name    string
		do      func()
		want    []netip.Prefix
		changed bool
		invalid int
	}{
		{"none", func() {}, nil, false, 0},
		{"default", func() { tr.SetServiceCIDR(serviceCIDR("kubernetes", "1", "10.96.0.0/16", "fd00:96::/108")) },
			prefixes("10.96.0.0/16", "fd00:96::/108"), true, 0},
		{"same version again", func() { tr.SetServiceCIDR(serviceCIDR("kubernetes", "1", "10.96.0.0/16", "fd00:96::/108")) },
			prefixes("10.96.0.0/16", "fd00:96::/108"), false, 0},
		// Sorted, each range once, host bits masked, the invalid one left out.
		{"second, overlapping, one invalid", func() { tr.SetServiceCIDR(serviceCIDR("extra", "2", "10.96.0.1/16", "10.0.0.0/24", "10.1.0.0/33")) },
			prefixes("10.0.0.0/24", "10.96.0.0/16", "fd00:96::/108"), true, 1},
		{"deleted", func() { tr.DeleteServiceCIDR("kubernetes") }, prefixes("10.0.0.0/24", "10.96.0.0/16"), true, 0},
		{"unknown deleted", func() { tr.DeleteServiceCIDR("nothing") }, prefixes("10.0.0.0/24", "10.96.0.0/16"), false, 0},
	}
	for _, st := range steps {
		invalid = nil
		select {
		case <-tr.Changed():
		default:
		}
		st.do()
		changed := false
		select {
		case <-tr.Changed():
			changed = true
		default:
		}
		if got := tr.Snapshot().ServiceCIDRs; !slices.Equal(got, st.want) {
			t.Errorf("%s: ServiceCIDRs = %v, want %v", st.name, got, st.want)
		}
		if changed != st.changed {
			t.Errorf("%s: changed = %v, want %v", st.name, changed, st.changed)
		}
		if len(invalid) != st.invalid {
			t.Errorf("%s: %d problems reported (%v), want %d", st.name, len(invalid), invalid, st.invalid)
		}
		for _, err := range invalid {
			var oe *ObjectError
			if !errors.As(err, &oe) || oe.Kind != KindServiceCIDR || !errors.Is(err, ErrInvalidPrefix) {
				t.Errorf("%s: problem %v: want an ObjectError of kind %s with ErrInvalidPrefix", st.name, err, KindServiceCIDR)
			}
		}
	}
}
