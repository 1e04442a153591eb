package k8s

import (
	"slices"
)

// Lookup returns the service port of that name, or nil. Services are sorted
// by name, so this is a binary search.
func (s *Snapshot) Lookup(name ServicePortName) *ServicePort {
	i, ok := slices.BinarySearchFunc(s.Services, name, func(sp ServicePort, n ServicePortName) int {
		return sp.Name.Compare(n)
	})
	if !ok {
		return nil
	}
	return &s.Services[i]
}

// Valid tells whether p is one of the protocols a service port may have.
func (p Protocol) Valid() bool {
	return p == TCP || p == UDP || p == SCTP
}
