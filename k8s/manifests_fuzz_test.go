package k8s

import (
	v1 "k8s.io/api/core/v1"

	"errors"
	"testing"
)

// FuzzManifests: any bytes in a manifest file decode to objects or to a
// clean error naming the file, never a panic; decoded objects are what the
// tracker can take (no nil ones).
func FuzzManifests(f *testing.F) {
	// The seeds are in testdata/fuzz/FuzzManifests.
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeFile("fuzz.yaml", data)
		if err != nil {
			var me *ManifestError
			if !errors.As(err, &me) || me.File != "fuzz.yaml" {
				t.Errorf("error %v does not name the file", err)
			}
			return
		}
		for _, s := range m.services {
			if s == nil {
				t.Error("nil service")
			}
		}
		for _, s := range m.slices {
			if s == nil {
				t.Error("nil slice")
			}
		}
		for _, n := range m.nodes {
			if n == nil {
				t.Error("nil node")
			}
		}
		// Whatever decoded goes through the tracker.
		tr := NewTracker(nil, TrackerOptions{FallbackNode: Node{Name: "node-1"}})
		var node *v1.Node
		if len(m.nodes) > 0 {
			node = m.nodes[0]
		}
		tr.ReplaceAll(m.services, m.slices, node)
		_ = tr.Snapshot()
	})
}
