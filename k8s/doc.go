// Package k8s turns Kubernetes objects into nftproxy's desired state: it
// validates Services and EndpointSlices, merges slices per service port, and
// publishes immutable Snapshots. Its sources are client-go informers on a real
// API server and a directory of YAML manifests; both feed the same tracker.
package k8s
