package k8s_test

import (
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/k8s"
	"github.com/nftproxy/nftproxy/k8s/k8sfuzz"
)

// FuzzTracker: any objects give a snapshot the compiler can rely on (sorted
// and unique service ports, valid addresses and ports, sorted endpoints),
// the same every time, and never a panic.
func FuzzTracker(f *testing.F) {
	// The seeds are in testdata/fuzz/FuzzTracker.
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, ok := k8sfuzz.Snapshot(data)
		if !ok {
			return
		}
		CheckSnapshot(t, snap)
		again, _ := k8sfuzz.Snapshot(data)
		if !reflect.DeepEqual(snap.Services, again.Services) {
			t.Errorf("the same objects made two snapshots:\n%+v\n%+v", snap.Services, again.Services)
		}
		if step, _ := k8sfuzz.Stepwise(data); !reflect.DeepEqual(snap.Services, step.Services) {
			t.Errorf("one slice at a time made another snapshot than all at once:\n%+v\n%+v", step.Services, snap.Services)
		}
	})
}

// CheckSnapshot reports what in snap breaks the tracker's promises.
func CheckSnapshot(t *testing.T, snap *k8s.Snapshot) {
	t.Helper()
	for i := range snap.Services {
		sp := &snap.Services[i]
		if i > 0 && snap.Services[i-1].Name.Compare(sp.Name) >= 0 {
			t.Errorf("service ports not sorted and unique: %v then %v", snap.Services[i-1].Name, sp.Name)
		}
		if sp.Port == 0 {
			t.Errorf("%v: port 0", sp.Name)
		}
		switch sp.Name.Protocol {
		case k8s.TCP, k8s.UDP, k8s.SCTP:
		default:
			t.Errorf("%v: protocol %q", sp.Name, sp.Name.Protocol)
		}
		for _, list := range [][]any{addrs(sp.ClusterIPs), addrs(sp.ExternalIPs), addrs(sp.LoadBalancerIPs)} {
			for _, a := range list {
				if a == nil {
					t.Errorf("%v: invalid address", sp.Name)
				}
			}
		}
		for _, p := range sp.LoadBalancerSourceRanges {
			if !p.IsValid() || p != p.Masked() {
				t.Errorf("%v: source range %v", sp.Name, p)
			}
		}
		for j, e := range sp.Endpoints {
			if !e.Addr.IsValid() || e.Addr.Zone() != "" || e.Port == 0 {
				t.Errorf("%v: endpoint %v:%d", sp.Name, e.Addr, e.Port)
			}
			if j > 0 {
				p := sp.Endpoints[j-1]
				if c := p.Addr.Compare(e.Addr); c > 0 || (c == 0 && p.Port >= e.Port) {
					t.Errorf("%v: endpoints not sorted and unique: %v:%d then %v:%d", sp.Name, p.Addr, p.Port, e.Addr, e.Port)
				}
			}
		}
	}
}

func addrs[T interface{ IsValid() bool }](as []T) []any {
	out := make([]any, len(as))
	for i, a := range as {
		if a.IsValid() {
			out[i] = a
		}
	}
	return out
}
