package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// proxyAPIWatch names the figures of no proxy at all: the bench's bare
// watches beside every proxy's steps, from the write to their event. They
// are the floor under every proxy's API write to kernel: what the API
// server takes to store a write and send it to a watcher.
const proxyAPIWatch = "api-watch"

// peerChange is one of a run's two API writes: its figures, what it puts
// into the kernel, the bare watch on the object it writes and the event
// that shows it, and the write (which calls before just before it).
type peerChange struct {
	sync, wall, own string
	kernel          kernelChange
	watch           func(c kubernetes.Interface) (watch.Interface, error)
	match           func(watch.Event) bool
	write           func(before func()) error
}

// changes are the k-th run's steps: one endpoint replaced, then one service
// added (its EndpointSlice is already there).
func (s *stepper) changes(ctx context.Context) []peerChange {
	w, k, i := s.w, s.k, s.w.stepService()
	addr, ip := replacementEndpoint(k), addedClusterIP(k)
	slice := sliceName(w.services[i].name, len(w.services[i].slices())-1)
	return []peerChange{{
		sync: peerEndpoint, wall: peerEndpointWal, own: peerEndpointOwn,
		kernel: kernelChange{addr: addr.As4(), text: "--to-destination " + netip.AddrPortFrom(addr, endpointPort).String()},
		watch: func(c kubernetes.Interface) (watch.Interface, error) {
			return c.DiscoveryV1().EndpointSlices(benchNamespace).Watch(ctx, byName(slice))
		},
		match: func(ev watch.Event) bool {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			return ok && ev.Type == watch.Modified && slices.ContainsFunc(es.Endpoints, func(ep discoveryv1.Endpoint) bool {
				return slices.Contains(ep.Addresses, addr.String())
			})
		},
		write: func(before func()) error { return s.cluster.replaceEndpoint(ctx, w, i, addr, before) },
	}, {
		sync: peerService, wall: peerServiceWall, own: peerServiceOwn,
		kernel: kernelChange{addr: ip.As4(), text: "-d " + ip.String() + "/32"},
		watch: func(c kubernetes.Interface) (watch.Interface, error) {
			return c.CoreV1().Services(benchNamespace).Watch(ctx, byName(addedServiceName(k)))
		},
		match: func(ev watch.Event) bool { return ev.Type == watch.Added },
		write: func(before func()) error {
			before()
			return s.cluster.createService(ctx, addedServiceName(k), ip)
		},
	}}
}

// watchStep opens a client-go watch of the bench's own on the one object
// step writes: when its event arrives is when the API server had the write
// stored and sent, which no proxy's watch can beat.
func (c *cluster) watchStep(step peerChange) (*watcher, error) {
	w, err := step.watch(c.watcher)
	if err != nil {
		return nil, fmt.Errorf("watch the step's object: %w", err)
	}
	return startWatcher("the bare watch", func() (time.Time, error) {
		for ev := range w.ResultChan() {
			if step.match(ev) {
				return time.Now(), nil
			}
		}
		return time.Time{}, errors.New("watch ended before the change came")
	}, w.Stop), nil
}

func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}
