// Package k8sfuzz turns a fuzzer's bytes into what the tracker makes of API
// objects, so the fuzz targets of k8s and proxier start from the same input.
package k8sfuzz

import (
	"encoding/json"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nftproxy/nftproxy/k8s"
)

// Objects is the input of the fuzz targets: API objects in JSON, with any
// field values, including ones the API server would reject.
type Objects struct {
	Services []*v1.Service                `json:"services"`
	Slices   []*discoveryv1.EndpointSlice `json:"slices"`
	Node     *v1.Node                     `json:"node"`
}

// Snapshot decodes data as Objects and returns the snapshot a tracker on
// node-1 makes of them; false when data is not such JSON.
func Snapshot(data []byte) (*k8s.Snapshot, bool) {
	return tracked(data, func(tr *k8s.Tracker, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice, node *v1.Node) {
		tr.ReplaceAll(svcs, slices, node)
	})
}

// Stepwise is Snapshot with the slices set one at a time, a snapshot taken
// after each: the tracker then splices a changed slice into the merged
// endpoints it keeps, where one ReplaceAll merges them once. Both must give
// the same snapshot.
func Stepwise(data []byte) (*k8s.Snapshot, bool) {
	return tracked(data, func(tr *k8s.Tracker, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice, node *v1.Node) {
		tr.ReplaceAll(svcs, nil, node)
		tr.Snapshot()
		for _, s := range slices {
			tr.SetSlice(s)
			tr.Snapshot()
		}
	})
}

// tracked decodes data, has load hand the objects to a tracker on node-1,
// and returns the tracker's snapshot.
func tracked(data []byte, load func(*k8s.Tracker, []*v1.Service, []*discoveryv1.EndpointSlice, *v1.Node)) (*k8s.Snapshot, bool) {
	svcs, slices, node, ok := decode(data)
	if !ok {
		return nil, false
	}
	tr := k8s.NewTracker(nil, k8s.TrackerOptions{FallbackNode: k8s.Node{Name: "node-1"}})
	load(tr, svcs, slices, node)
	return tr.Snapshot(), true
}

// decode reads data as Objects, without the nil objects informers never
// hand over.
func decode(data []byte) ([]*v1.Service, []*discoveryv1.EndpointSlice, *v1.Node, bool) {
	var objs Objects
	if json.Unmarshal(data, &objs) != nil {
		return nil, nil, nil, false
	}
	var svcs []*v1.Service
	for _, s := range objs.Services {
		if s != nil {
			svcs = append(svcs, s)
		}
	}
	var slices []*discoveryv1.EndpointSlice
	for _, s := range objs.Slices {
		if s != nil {
			slices = append(slices, s)
		}
	}
	return svcs, slices, objs.Node, true
}
