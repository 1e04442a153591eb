package main

import (
	"context"
	"fmt"
	"net/netip"
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

// bareWatch is a client-go watch of the bench's own on the one object a
// step writes: when its event arrives is when the API server had the write
// stored and sent, which no proxy's watch can beat.
type bareWatch struct {
	done chan struct{}
	at   time.Time
	err  error
}

// watchStep opens bare watches for the endpoint or the service step of run
// k: the endpoint step's EndpointSlice modified to hold addr, or the k-th
// added Service created. Pass an invalid addr for the service step.
func (e *peerEnv) watchStep(ctx context.Context, k int, addr netip.Addr) (*bareWatch, error) {
	if e.watcher == nil {
		cfg := *e.cluster.srv.RestConfig
		cfg.ContentType = "application/vnd.kubernetes.protobuf" // as nftproxy and kube-proxy ask
		c, err := kubernetes.NewForConfig(&cfg)
		if err != nil {
			return nil, fmt.Errorf("make watch client: %w", err)
		}
		e.watcher = c
	}
	var (
		w     watch.Interface
		err   error
		match func(watch.Event) bool
	)
	if addr.IsValid() {
		s := &e.w.services[e.w.stepService()]
		name := sliceName(s.name, len(s.slices())-1)
		w, err = e.watcher.DiscoveryV1().EndpointSlices(benchNamespace).Watch(ctx, byName(name))
		match = func(ev watch.Event) bool {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			return ok && ev.Type == watch.Modified && sliceHas(es, addr)
		}
	} else {
		w, err = e.watcher.CoreV1().Services(benchNamespace).Watch(ctx, byName(addedServiceName(k)))
		match = func(ev watch.Event) bool { return ev.Type == watch.Added }
	}
	if err != nil {
		return nil, fmt.Errorf("watch the step's object: %w", err)
	}
	b := &bareWatch{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if match(ev) {
				b.at = time.Now()
				return
			}
		}
		b.err = fmt.Errorf("watch ended before the change came")
	}()
	return b, nil
}

func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// arrived returns when the event came; the watch ends with ctx.
func (b *bareWatch) arrived(ctx context.Context) (time.Time, error) {
	select {
	case <-b.done:
		return b.at, b.err
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("wait for the bare watch: %w", ctx.Err())
	}
}

func sliceHas(es *discoveryv1.EndpointSlice, addr netip.Addr) bool {
	for _, ep := range es.Endpoints {
		for _, a := range ep.Addresses {
			if a == addr.String() {
				return true
			}
		}
	}
	return false
}
