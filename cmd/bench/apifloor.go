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

// proxyAPIWatch names the figures of no proxy at all: a client-go watch in
// the bench receiving the same writes the proxies' steps make. Its API
// write to kernel figures are the floor under every proxy's: what the API
// server takes to store a write and send it to a watcher.
const proxyAPIWatch = "api-watch"

// apiFloor times the endpoint and the service step's writes to a bare watch
// (protobuf, straight to the API server on loopback, where the proxies go
// through a relay), then puts the API state back as a proxy run does.
func (e *peerEnv) apiFloor(ctx context.Context) error {
	k := e.runIndex
	e.runIndex++
	if err := e.cluster.createAddedSlice(ctx, e.w, k); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	i := e.w.stepService()
	s := &e.w.services[i]
	addr := replacementEndpoint(k)
	cfg := *e.cluster.srv.RestConfig
	cfg.ContentType = "application/vnd.kubernetes.protobuf" // as nftproxy and kube-proxy ask
	watcher, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return fmt.Errorf("make watch client: %w", err)
	}
	sliceAPI := watcher.DiscoveryV1().EndpointSlices(benchNamespace)
	sw, err := sliceAPI.Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", sliceName(s.name, len(s.slices())-1)).String()})
	if err != nil {
		return fmt.Errorf("watch endpoint slice: %w", err)
	}
	var t0 time.Time
	if _, err := e.cluster.replaceEndpoint(wctx, e.w, i, addr, func() { t0 = time.Now() }); err != nil {
		sw.Stop()
		return err
	}
	at, err := firstEvent(sw, func(ev watch.Event) bool {
		es, ok := ev.Object.(*discoveryv1.EndpointSlice)
		return ok && ev.Type == watch.Modified && sliceHas(es, addr)
	})
	if err != nil {
		return fmt.Errorf("endpoint step: %w", err)
	}
	e.run.add(e.w.spec.name, proxyAPIWatch, peerEndpointWal, ms(at.Sub(t0)), 0)

	name := addedServiceName(k)
	vw, err := watcher.CoreV1().Services(benchNamespace).Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return fmt.Errorf("watch service: %w", err)
	}
	t0 = time.Now()
	if err := e.cluster.createAddedService(wctx, k); err != nil {
		vw.Stop()
		return err
	}
	if at, err = firstEvent(vw, func(ev watch.Event) bool { return ev.Type == watch.Added }); err != nil {
		return fmt.Errorf("service step: %w", err)
	}
	e.run.add(e.w.spec.name, proxyAPIWatch, peerServiceWall, ms(at.Sub(t0)), 0)
	return e.restore(ctx, k)
}

// firstEvent returns when the watch delivered the first event match takes,
// and stops the watch.
func firstEvent(w watch.Interface, match func(watch.Event) bool) (time.Time, error) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if match(ev) {
			return time.Now(), nil
		}
	}
	return time.Time{}, fmt.Errorf("watch ended before the change came")
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
