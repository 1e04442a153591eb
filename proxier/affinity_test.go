package proxier

import (
	"net/netip"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/k8s"
	m "github.com/nftproxy/nftproxy/nftmodel"
)

// affinityElement is an affinity map element: client to entry, endpoint.
func affinityElement(client, entry string, port uint32, target string) m.Element {
	t := netip.MustParseAddrPort(target)
	return m.Element{
		Key:  []m.Value{m.A(netip.MustParseAddr(client)), m.A(netip.MustParseAddr(entry)), m.N(6), m.N(port)},
		Data: []m.Value{m.A(t.Addr()), m.N(uint32(t.Port()))},
	}
}

// TestAffinityPrune checks which affinity map elements a sync deletes: after
// an update, those naming an endpoint removed under their entry; after a
// full sync, those naming no live endpoint of their entry.
func TestAffinityPrune(t *testing.T) {
	affinity := func(sp *k8s.ServicePort) { sp.AffinityTimeout = time.Hour }
	c := newCompiler(testConfig, &k8s.Snapshot{})
	three := c.piece(ptr(svc("web", "http", "10.96.0.10", 3, nodePort(30080), affinity)))
	two := c.piece(ptr(svc("web", "http", "10.96.0.10", 2, nodePort(30080), affinity))) // .12 removed
	plain := c.piece(ptr(svc("web", "http", "10.96.0.10", 2, nodePort(30080))))

	tests := []struct {
		name  string
		prune *affinityPrune
		el    m.Element
		keep  bool
	}{
		{"update: a kept endpoint stays", removedAffinity(nil, three, two),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.10:8080"), true},
		{"update: the removed endpoint goes", removedAffinity(nil, three, two),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.12:8080"), false},
		{"update: the removed endpoint goes from the NodePort entry", removedAffinity(nil, three, two),
			affinityElement("192.168.77.2", "192.168.77.1", 30080, "10.244.1.12:8080"), false},
		{"update: another entry's element stays", removedAffinity(nil, three, two),
			affinityElement("192.168.77.2", "10.96.0.11", 80, "10.244.1.12:8080"), true},
		{"update: affinity switched off removes every endpoint", removedAffinity(nil, three, plain),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.10:8080"), false},
		{"update: a service without affinity before prunes nothing", removedAffinity(nil, plain, two), m.Element{}, true},
		{"full: a live endpoint stays", liveOf(two),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.11:8080"), true},
		{"full: a live endpoint stays under the NodePort", liveOf(two),
			affinityElement("192.168.77.2", "192.168.77.1", 30080, "10.244.1.11:8080"), true},
		{"full: an endpoint gone goes", liveOf(two),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.12:8080"), false},
		{"full: an entry without affinity goes", liveOf(plain),
			affinityElement("192.168.77.2", "10.96.0.10", 80, "10.244.1.10:8080"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.prune == nil {
				if !tt.keep {
					t.Fatal("no prune, but an element should go")
				}
				return
			}
			if got := tt.prune.keep(tt.el); got != tt.keep {
				t.Errorf("keep = %v, want %v", got, tt.keep)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// liveOf is the prune of a full sync of p alone.
func liveOf(p *piece) *affinityPrune {
	a := newLiveAffinity()
	a.live(p)
	return a
}
