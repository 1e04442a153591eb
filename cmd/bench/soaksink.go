package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// soakSink writes one service's EndpointSlice where nftproxy reads it.
type soakSink interface {
	write(ctx context.Context, s *soakService, eps []soakEndpoint) error
}

// soakSlice is the EndpointSlice of a soak service: its one slice (the
// soak's services are narrower than sliceSize), terminating endpoints
// neither ready nor gone, as the EndpointSlice controller writes a pod that
// is shutting down. It carries the time of the change as the controller's
// last-change-trigger-time, from which the proxy measures network
// programming latency (the SLI the soak reports).
func soakSlice(s *soakService, eps []soakEndpoint) *discoveryv1.EndpointSlice {
	es := sliceObject(s.name, 0, nil, nil)
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}
	for _, e := range eps {
		ep := readyEndpoint(e.addr)
		if e.terminating {
			ep.Conditions.Ready, ep.Conditions.Terminating = ptr.To(false), ptr.To(true)
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

// apiSink writes slices through the API server.
type apiSink struct{ client kubernetes.Interface }

func (a apiSink) write(ctx context.Context, s *soakService, eps []soakEndpoint) error {
	es := soakSlice(s, eps)
	// No resourceVersion: the soak is the slices' only writer, and an
	// unconditional update saves reading each slice first.
	if _, err := a.client.DiscoveryV1().EndpointSlices(benchNamespace).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpoint slice %s: %w", es.Name, err)
	}
	return nil
}

// manifestSink keeps one manifest file per service, each replaced whole by
// a rename as WatchDir wants.
type manifestSink struct{ dir string }

func (m manifestSink) write(_ context.Context, s *soakService, eps []soakEndpoint) error {
	svc := serviceObject(s.name, s.clusterIP)
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	es := soakSlice(s, eps)
	es.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	var b bytes.Buffer
	for i, obj := range []any{svc, es} {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("encode manifest of %s: %w", s.name, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(data)
	}
	path := filepath.Join(m.dir, s.name+".yaml")
	tmp := filepath.Join(m.dir, "."+s.name+".tmp")
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// soakWrite is one slice write: the service's endpoints when it was queued.
type soakWrite struct {
	svc       int
	endpoints []soakEndpoint
	retiring  netip.Addr // a replacement's endpoint turned terminating; zero for a removal
	added     netip.Addr // a replacement's new endpoint
	removed   netip.Addr // a removal's endpoint
	queued    time.Time
}

// soakWriters write slices with a pool of workers; every write of a service
// goes to the same worker, so a service's writes land in order.
type soakWriters struct {
	sink     soakSink
	services []soakService
	queues   []chan soakWrite
	written  chan soakWrite // replacements once written: their grace starts
	history  *addrHistory
	wg       sync.WaitGroup

	done, failed atomic.Int64
	mu           sync.Mutex
	latency      []float64 // ms from queued to written
	firstErr     error
}

// soakWriteTries is how often a write is tried before it counts as failed.
const soakWriteTries = 3

func startSoakWriters(ctx context.Context, sink soakSink, services []soakService, workers int, history *addrHistory) *soakWriters {
	w := &soakWriters{sink: sink, services: services, written: make(chan soakWrite, 1<<16), history: history}
	for range workers {
		q := make(chan soakWrite, 256)
		w.queues = append(w.queues, q)
		w.wg.Go(func() {
			for job := range q {
				w.do(ctx, job)
			}
		})
	}
	return w
}

// queue hands a write to its service's worker; it blocks while that worker
// is behind.
func (w *soakWriters) queue(job soakWrite) {
	job.queued = time.Now()
	w.queues[job.svc%len(w.queues)] <- job
}

func (w *soakWriters) do(ctx context.Context, job soakWrite) {
	var err error
	for try := range soakWriteTries {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		if err = w.sink.write(ctx, &w.services[job.svc], job.endpoints); err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		w.failed.Add(1)
		w.mu.Lock()
		if w.firstErr == nil {
			w.firstErr = err
		}
		w.mu.Unlock()
		return
	}
	w.done.Add(1)
	w.mu.Lock()
	w.latency = append(w.latency, ms(time.Since(job.queued)))
	w.mu.Unlock()
	w.history.add(job.added, evAddedWritten, job.svc)
	w.history.add(job.retiring, evRetiringWritten, job.svc)
	w.history.add(job.removed, evRemovedWritten, job.svc)
	if job.retiring.IsValid() {
		w.written <- job
	}
}

// lagSince returns the mean queued-to-written time of the writes after the
// first from, and how many writes there are now.
func (w *soakWriters) lagSince(from int) (mean float64, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n = len(w.latency)
	if n <= from {
		return 0, n
	}
	sum := 0.0
	for _, v := range w.latency[from:] {
		sum += v
	}
	return sum / float64(n-from), n
}

// close waits for every queued write.
func (w *soakWriters) close() {
	for _, q := range w.queues {
		close(q)
	}
	w.wg.Wait()
}
