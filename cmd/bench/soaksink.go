package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// soakSink writes one service's EndpointSlice where nftproxy reads it.
type soakSink func(ctx context.Context, s *wlService, eps []soakEndpoint) error

// soakSlice is the EndpointSlice of a soak service: its one slice (the
// soak's services are narrower than sliceSize), terminating endpoints
// neither ready nor gone, as the EndpointSlice controller writes a pod that
// is shutting down. It carries the time of the change as the controller's
// last-change-trigger-time, from which the proxy measures network
// programming latency (the SLI the soak reports).
func soakSlice(s *wlService, eps []soakEndpoint) *discoveryv1.EndpointSlice {
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
func apiSink(client kubernetes.Interface) soakSink {
	return func(ctx context.Context, s *wlService, eps []soakEndpoint) error {
		return updateSlice(ctx, client, soakSlice(s, eps))
	}
}

// manifestSink keeps one manifest file per service in dir, each replaced
// whole by a rename as WatchDir wants.
func manifestSink(dir string) soakSink {
	return func(_ context.Context, s *wlService, eps []soakEndpoint) error {
		svc := serviceObject(s.name, s.clusterIP)
		svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
		es := soakSlice(s, eps)
		es.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		svcYAML, err := yaml.Marshal(svc)
		if err != nil {
			return fmt.Errorf("encode service %s: %w", s.name, err)
		}
		esYAML, err := yaml.Marshal(es)
		if err != nil {
			return fmt.Errorf("encode endpoint slice %s: %w", s.name, err)
		}
		tmp := filepath.Join(dir, "."+s.name+".tmp")
		err = os.WriteFile(tmp, slices.Concat(svcYAML, []byte("---\n"), esYAML), 0o644)
		if err == nil {
			err = os.Rename(tmp, filepath.Join(dir, s.name+".yaml"))
		}
		if err != nil {
			return fmt.Errorf("write manifest: %w", err)
		}
		return nil
	}
}

// soakWrite is one slice write: the service's endpoints when it was queued,
// and once done, when and how it ended.
type soakWrite struct {
	soakChange
	endpoints       []soakEndpoint // nil once done
	queued, written time.Time
	err             error // of the last try
}

// soakWriters write slices with a pool of workers; every write of a service
// goes to the same worker, so a service's writes land in order.
type soakWriters struct {
	sink     soakSink
	services []wlService
	queues   []chan soakWrite
	written  chan soakWrite // replacements once written: their grace starts
	wg       sync.WaitGroup
	stopped  sync.Once
	done     eventLog[soakWrite] // in the order they ended
}

// soakWriteTries is how often a write is tried before it counts as failed.
const soakWriteTries = 3

func startSoakWriters(ctx context.Context, sink soakSink, services []wlService, workers int) *soakWriters {
	w := &soakWriters{sink: sink, services: services, written: make(chan soakWrite, 1<<16)}
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

// queue hands a change with the service's endpoints after it to its
// service's worker; it blocks while that worker is behind.
func (w *soakWriters) queue(c soakChange, endpoints []soakEndpoint) {
	w.queues[c.svc%len(w.queues)] <- soakWrite{soakChange: c, endpoints: endpoints, queued: time.Now()}
}

func (w *soakWriters) do(ctx context.Context, job soakWrite) {
	for try := range soakWriteTries {
		if try > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		if job.err = w.sink(ctx, &w.services[job.svc], job.endpoints); job.err == nil || ctx.Err() != nil {
			break
		}
	}
	job.written, job.endpoints = time.Now(), nil
	w.done.add(job)
	if job.err == nil && job.retiring.IsValid() {
		w.written <- job
	}
}

// lagSince returns the mean queued-to-written time of the writes done
// after the first from, and how many are done now.
func (w *soakWriters) lagSince(from int) (mean float64, n int) {
	writes := w.done.since(from)
	lat := writeLatencies(writes)
	for _, v := range lat {
		mean += v / float64(len(lat))
	}
	return mean, from + len(writes)
}

// writeLatencies returns the queued-to-written times of the writes that
// went through, in milliseconds.
func writeLatencies(writes []soakWrite) []float64 {
	var out []float64
	for _, j := range writes {
		if j.err == nil {
			out = append(out, ms(j.written.Sub(j.queued)))
		}
	}
	return out
}

// stop waits for every queued write and ends the workers; it may be called
// again (the soak's clean-up calls it when a later step failed).
func (w *soakWriters) stop() {
	w.stopped.Do(func() {
		for _, q := range w.queues {
			close(q)
		}
		w.wg.Wait()
	})
}

// close stops the writers, and records the writes in run.
func (w *soakWriters) close(run *SoakRun) {
	w.stop()
	writes := w.done.since(0)
	lat := writeLatencies(writes)
	run.Writes, run.WriteErrors, run.WriteP99MS = len(lat), len(writes)-len(lat), quantile(lat, 0.99)
	for _, j := range writes {
		if j.err != nil && run.FirstError == "" {
			run.FirstError = j.err.Error()
		}
	}
}
