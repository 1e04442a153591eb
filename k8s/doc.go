// Package k8s turns Kubernetes objects into nftproxy's desired state: it
// validates Services and EndpointSlices, merges slices per service port, and
// publishes immutable Snapshots. Its sources are client-go informers on a real
// API server and a directory of YAML manifests; both feed the same tracker.
//
// # Conversion
//
// ServicePorts, EndpointsFromSlice and NodeFrom are pure. They read unset
// fields as the API server would default them, so manifests that never went
// through an API server mean the same as objects that did. A problem in a
// service-wide field (an address, a policy, the name) skips the service; a
// problem in a port skips the port; a bad endpoint skips the endpoint; a slice
// that can't be attributed to a service is skipped whole. Each problem is an
// *ObjectError naming the object, the field and what was left out; match the
// reason with errors.Is (ErrInvalidIP, ErrPortRange, ...). ExternalName,
// headless and other proxies' services are ignored, as kube-proxy ignores
// them, without an error.
//
// # Tracker
//
// The Tracker keeps what it converted from the objects (not the objects:
// a service port with one slice shares that slice's endpoint list) and
// builds a Snapshot on demand:
// services sorted by name, endpoints merged over all slices of a service
// (IPv4 and IPv6 alike), sorted by address and port, each address and port
// once with its best conditions. It signals changes on a one-slot channel,
// so a burst of events wakes the consumer once, and ignores updates that
// change nothing. Service ports that claim an address, protocol and port (or
// a node port) another one already has are left out, the older service
// winning: otherwise the kernel would refuse the whole ruleset for one bad
// object.
//
// # Sources
//
// RunInformers watches Services, EndpointSlices and this node's Node with the
// label selectors kube-proxy uses; apply nothing before it reports synced.
// WatchDir loads a manifest directory and watches it with inotify, reading
// each changed file on its own clock (DefaultSettle after it was renamed in
// or last written in place; see WatchDir for when a file counts): a file
// that is broken keeps its last good objects while the others apply. It keeps
// only the keys of what each file yielded and hands the tracker each read
// file's changes through Tracker.Edit, as one change. LoadDir reads a
// directory once.
package k8s
