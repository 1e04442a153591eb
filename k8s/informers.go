package k8s

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// proxiedSelector selects what kube-proxy selects: neither another proxy's
// services nor headless ones (nor their slices, which carry the labels too).
func proxiedSelector() string {
	sel := labels.NewSelector()
	for _, l := range []string{LabelServiceProxyName, v1.IsHeadlessService} {
		req, err := labels.NewRequirement(l, selection.DoesNotExist, nil)
		if err != nil {
			panic(fmt.Sprintf("build label selector: %v", err)) // constant input
		}
		sel = sel.Add(*req)
	}
	return sel.String()
}

// RunInformers starts informers on Services, EndpointSlices and, when
// nodeName is set, this node's Node, all in one shared factory, feeding
// tracker; and on ServiceCIDRs when the API server serves them. They stop when ctx ends. synced reports true once every informer
// has listed and the tracker has received everything listed: apply nothing
// before, or the first sync would remove every service (see WaitForSync).
func RunInformers(ctx context.Context, client kubernetes.Interface, nodeName string, tracker *Tracker, log *zap.Logger) (synced func() bool) {
	return RunInformersResync(ctx, client, nodeName, 0, tracker, log)
}

// RunInformersResync is RunInformers with the informers' resync period
// (kube-proxy's configSyncPeriod; 0: none).
func RunInformersResync(ctx context.Context, client kubernetes.Interface, nodeName string, resync time.Duration, tracker *Tracker, log *zap.Logger) (synced func() bool) {
	if log == nil {
		log = zap.NewNop()
	}
	selector := proxiedSelector()
	factory := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
		informers.WithTransform(slim))

	regs := []cache.ResourceEventHandlerRegistration{
		addHandler(log, KindService, factory.Core().V1().Services().Informer(),
			handlers(log, KindService, tracker.SetService, tracker.DeleteService)),
		addHandler(log, KindEndpointSlice, factory.Discovery().V1().EndpointSlices().Informer(),
			handlers(log, KindEndpointSlice, tracker.SetSlice, tracker.DeleteSlice)),
	}
	if nodeName != "" {
		regs = append(regs, addHandler(log, KindNode, nodeInformer(factory, nodeName), nodeHandlers(log, nodeName, tracker)))
	}

	// Whether to watch ServiceCIDRs is a question for the API server, which
	// may be down right now: ask in the background so that startup (and a
	// SIGTERM during it) never waits on it; synced stays false until answered.
	var cidrsSynced atomic.Pointer[func() bool]
	go func() {
		if done, ok := watchServiceCIDRs(ctx, client, tracker, log); ok {
			cidrsSynced.Store(&done)
		}
	}()

	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	return func() bool {
		if f := cidrsSynced.Load(); f == nil || !(*f)() {
			return false
		}
		for _, r := range regs {
			if !r.HasSynced() {
				return false
			}
		}
		return true
	}
}

// addHandler adds h to inf; a registration that never syncs stands for one
// that failed, so that nothing is applied without that kind.
func addHandler(log *zap.Logger, kind string, inf cache.SharedIndexInformer, h cache.ResourceEventHandlerFuncs) cache.ResourceEventHandlerRegistration {
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		// Only a stopped informer refuses handlers; ours is new.
		log.Error("Failed to add event handler", zap.String("kind", kind), zap.Error(err))
		return neverSynced{}
	}
	return reg
}

// nodeInformer is the factory's informer on the one Node named nodeName.
func nodeInformer(factory informers.SharedInformerFactory, nodeName string) cache.SharedIndexInformer {
	nodeSel := fields.OneTermEqualSelector("metadata.name", nodeName).String()
	return factory.InformerFor(&v1.Node{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredNodeInformer(c, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.FieldSelector = nodeSel })
	})
}

// nodeHandlers feed the Node named nodeName to tracker. The informer's field
// selector already filters; the check guards against clients that ignore it
// (the fake clientset does).
func nodeHandlers(log *zap.Logger, nodeName string, tracker *Tracker) cache.ResourceEventHandlerFuncs {
	setNode := func(n *v1.Node) {
		if n.Name == nodeName {
			tracker.SetNode(n)
		}
	}
	return handlers(log, KindNode, setNode, func(_, name string) {
		if name == nodeName {
			tracker.SetNode(nil)
		}
	})
}

// watchServiceCIDRs waits until the API server tells whether it serves
// ServiceCIDRs, and when it does starts an informer on them feeding tracker.
// synced reports whether that informer has synced (always true when there
// is none); ok is false when ctx ended first or the handler was refused.
func watchServiceCIDRs(ctx context.Context, client kubernetes.Interface, tracker *Tracker, log *zap.Logger) (synced func() bool, ok bool) {
	serves, err := waitServesServiceCIDRs(ctx, client, log)
	if err != nil {
		return nil, false // ctx ended
	}
	if !serves {
		return func() bool { return true }, true
	}
	// Not label-filtered: a ServiceCIDR has nothing to do with proxies.
	inf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slim)).
		Networking().V1().ServiceCIDRs().Informer()
	reg, err := inf.AddEventHandler(handlers(log, KindServiceCIDR, tracker.SetServiceCIDR,
		func(_, name string) { tracker.DeleteServiceCIDR(name) }))
	if err != nil {
		log.Error("Failed to add event handler", zap.String("kind", KindServiceCIDR), zap.Error(err))
		return nil, false
	}
	go inf.RunWithContext(ctx)
	return reg.HasSynced, true
}

// slim drops what the informers' caches would hold for nothing: managed
// fields and kubectl's copy of the last applied object, often most of an
// object's size.
func slim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		// The object is fresh from the decoder, not shared yet.
		delete(m.GetAnnotations(), v1.LastAppliedConfigAnnotation)
	}
	return obj, nil
}

// waitServesServiceCIDRs tells whether the API server has networking.k8s.io/v1
// ServiceCIDRs (Kubernetes 1.33 and later): an informer on a resource the
// server lacks would never sync, and nothing would ever be applied. It asks
// every second until the server answers or ctx ends (the only error).
func waitServesServiceCIDRs(ctx context.Context, client kubernetes.Interface, log *zap.Logger) (bool, error) {
	var serves bool
	lvl := log.Info // the first failure; the others at debug level
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if serves, err = servesServiceCIDRs(ctx, client); err != nil {
			lvl("Cannot tell yet whether the API server serves ServiceCIDRs; retrying", zap.Error(err))
			lvl = log.Debug
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("discover ServiceCIDRs: %w", err)
	}
	if !serves {
		log.Info("Not watching ServiceCIDRs: the API server does not serve them")
	}
	return serves, nil
}

// servesServiceCIDRs asks once. A 404 for the group version is an answer
// (no); anything else (refused, timeout, 5xx) is an error worth retrying.
func servesServiceCIDRs(ctx context.Context, client kubernetes.Interface) (bool, error) {
	gv := networkingv1.SchemeGroupVersion.String()
	list := &metav1.APIResourceList{}
	var err error
	if rc := client.Discovery().RESTClient(); rc != nil {
		// The discovery client's own call takes no context and retries on
		// its own; this one stops with ctx.
		err = rc.Get().AbsPath("/apis", gv).Do(ctx).Into(list)
	} else {
		list, err = client.Discovery().ServerResourcesForGroupVersion(gv) // fake clientsets
	}
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "servicecidrs" {
			return true, nil
		}
	}
	return false, nil
}

// WaitForSync waits until synced reports true or ctx ends.
func WaitForSync(ctx context.Context, synced func() bool) error {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return fmt.Errorf("wait for informers to sync: %w", context.Cause(ctx))
	}
	return nil
}

type neverSynced struct{}

func (neverSynced) HasSynced() bool                     { return false }
func (neverSynced) HasSyncedChecker() cache.DoneChecker { return nil }

// handlers feeds an informer's objects of type T to set and its deletions
// to del.
func handlers[T any](log *zap.Logger, kind string, set func(T), del func(namespace, name string)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setTyped(log, kind, obj, set) },
		UpdateFunc: func(_, obj any) { setTyped(log, kind, obj, set) },
		DeleteFunc: func(obj any) { deleteKey(log, kind, obj, del) },
	}
}

func setTyped[T any](log *zap.Logger, kind string, obj any, set func(T)) {
	o, ok := obj.(T)
	if !ok {
		log.Error("Unexpected object from informer", zap.String("kind", kind), zap.String("type", fmt.Sprintf("%T", obj)))
		return
	}
	set(o)
}

// deleteKey calls del with the namespace and name of a deleted object, which
// may come as a tombstone when the watch missed the deletion.
func deleteKey(log *zap.Logger, kind string, obj any, del func(namespace, name string)) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		var ns, name string
		if ns, name, err = cache.SplitMetaNamespaceKey(key); err == nil {
			del(ns, name)
			return
		}
	}
	log.Error("Cannot name deleted object", zap.String("kind", kind), zap.Error(err))
}
