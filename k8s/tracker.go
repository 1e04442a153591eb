package k8s

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TrackerOptions configure a Tracker.
type TrackerOptions struct {
	// FallbackNode stands for this node while there is no Node object
	// (--hostname-override, --node-ip); its addresses also stand in for a
	// Node object that has none.
	FallbackNode Node
	// OnInvalid, when set, is called for each problem found in an object,
	// once per version of the object, outside the tracker's lock.
	OnInvalid func(kind, namespace, name string, err error)
}

// Stats count what the tracker saw since it started.
type Stats struct {
	ServiceChanges  uint64 // service events that changed a service's ports
	EndpointChanges uint64 // slice events that changed some endpoints
	NodeChanges     uint64
	Invalid         uint64 // problems found in objects, each logged
}

// Tracker holds the current Services, EndpointSlices and Node, and builds
// Snapshots from them. Sources (informers, the manifest directory) call the
// Set and Delete methods; the proxier reads Snapshot after each signal on
// Changed. It is safe for concurrent use.
type Tracker struct {
	log     *zap.Logger
	opts    TrackerOptions
	changed chan struct{}

	mu       sync.Mutex
	services map[types.NamespacedName]*serviceEntry
	slices   map[types.NamespacedName]*sliceEntry
	// byService holds each service's converted slices, sorted by slice name
	// so that ties between duplicate endpoints break the same way every
	// time; replaced, never modified in place. (A list, not a map by name:
	// most services have one slice, and 100k one-entry maps were a tenth of
	// the heap.)
	byService map[types.NamespacedName][]*SliceEndpoints
	merged    map[types.NamespacedName][]ServicePort // with endpoints; built lazily
	// spliced holds the services whose merged ports a slice change patched
	// since they were last read (TakeChanges, a snapshot).
	spliced map[types.NamespacedName]bool
	// deltas are the splices' endpoint deltas by service port, handed
	// over with the changes.
	deltas map[ServicePortName]*EndpointDelta
	node   *nodeEntry
	// ServiceCIDR objects by name.
	serviceCIDRs map[string]*serviceCIDREntry
	snap         *Snapshot // nil when something changed since the last one
	stats        Stats

	// Kept between snapshots while no service changes.
	servicesDirty bool                   // the service order must be made again
	keys          []types.NamespacedName // of services with ports, sorted
	nPorts        int
	skip          map[ServicePortName]bool // ports left out for a conflict
	// conflicts holds those ports by service, so that a check can forget
	// the outcome of the services it weighs again, and only theirs.
	conflicts map[types.NamespacedName][]portConflict

	// dirty holds the service ports that changed since the last
	// TakeChanges: the proxier's delta sync looks at these only.
	dirty map[ServicePortName]struct{}
	// claims lists the services whose ports claim each address, protocol
	// and port (and node port): a service change whose keys no other port
	// claims, before or after, skips the conflict check, and one that
	// touches a claimed key tells whom the check must weigh.
	claims map[claimKey]claimants
	// contested holds the services that claimed or claim a key another
	// port claims too, since the last check: the conflicts among them and
	// those they compete with must be found again.
	contested map[types.NamespacedName]struct{}

	// started: trigger times before it are ignored, as kube-proxy does, so
	// the objects listed at start-up don't count as programmed late.
	started time.Time
	// triggers holds, by service, the last-change-trigger-time annotations
	// of the slice changes since the last TakeChanges.
	triggers map[types.NamespacedName][]TriggerTime
	// taken are the counters as of the last TakeChanges: the changes since
	// are pending.
	taken Stats
}

// The entries keep what was derived from an object, not the object: at tens
// of thousands of services the API objects would be most of the daemon's heap.
type serviceEntry struct {
	version string        // resourceVersion; empty for manifests
	created metav1.Time   // the older service wins a conflict
	ports   []ServicePort // without endpoints
	errs    []error
}

type sliceEntry struct {
	version string
	eps     *SliceEndpoints // nil when the slice is skipped
	errs    []error
}

type nodeEntry struct {
	version string
	node    Node
	errs    []error
}

// NewTracker returns an empty tracker; log receives a warning for each
// invalid object.
func NewTracker(log *zap.Logger, opts TrackerOptions) *Tracker {
	if log == nil {
		log = zap.NewNop()
	}
	return &Tracker{
		log:       log,
		opts:      opts,
		changed:   make(chan struct{}, 1),
		services:  map[types.NamespacedName]*serviceEntry{},
		slices:    map[types.NamespacedName]*sliceEntry{},
		byService: map[types.NamespacedName][]*SliceEndpoints{},
		merged:    map[types.NamespacedName][]ServicePort{},
		spliced:   map[types.NamespacedName]bool{},
		deltas:    map[ServicePortName]*EndpointDelta{},
		dirty:     map[ServicePortName]struct{}{},
		skip:      map[ServicePortName]bool{},
		conflicts: map[types.NamespacedName][]portConflict{},
		claims:    map[claimKey]claimants{},
		contested: map[types.NamespacedName]struct{}{},
		started:   time.Now(),
		triggers:  map[types.NamespacedName][]TriggerTime{},
	}
}

// Changed receives a value after the tracker's state changed; several changes
// before the receiver reads are coalesced into one.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }

// NodeName is the name of this node as configured (the fallback node's).
func (t *Tracker) NodeName() string { return t.opts.FallbackNode.Name }

// Stats returns the counters since the tracker started.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Pending counts the service and endpoint changes seen since the last
// TakeChanges, which no sync has taken yet: kube-proxy's
// sync_proxy_rules_{service,endpoint}_changes_pending.
func (t *Tracker) Pending() (services, endpoints uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats.ServiceChanges - t.taken.ServiceChanges, t.stats.EndpointChanges - t.taken.EndpointChanges
}

// update runs f under the lock, then reports the problems f found and
// signals a change when f made one.
func (t *Tracker) update(f func(*batch)) {
	var b batch
	t.mu.Lock()
	f(&b)
	if b.changed {
		t.snap = nil
	}
	t.stats.Invalid += uint64(len(b.problems) + len(b.counted))
	t.mu.Unlock()
	t.report(b.problems)
	if t.opts.OnInvalid != nil {
		for _, c := range b.counted {
			t.opts.OnInvalid(c.kind, c.namespace, c.name, c.err)
		}
	}
	if b.changed {
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
}

// batch gathers the outcome of one update.
type batch struct {
	changed  bool
	problems []error
	// counted are problems the source logged itself: they are only counted.
	counted []sourceProblem
}

type sourceProblem struct {
	kind, namespace, name string
	err                   error
}

func (t *Tracker) report(problems []error) {
	for _, err := range problems {
		var kind, ns, name string
		if oe, ok := err.(*ObjectError); ok {
			kind, ns, name = oe.Kind, oe.Namespace, oe.Name
		}
		t.log.Warn("Skipping invalid object data", zap.String("kind", kind), zap.String("namespace", ns),
			zap.String("name", name), zap.Error(err))
		if t.opts.OnInvalid != nil {
			t.opts.OnInvalid(kind, ns, name, err)
		}
	}
}

// SetService adds or updates a Service.
func (t *Tracker) SetService(svc *v1.Service) {
	t.update(func(b *batch) { t.setService(b, svc) })
}

// DeleteService removes a Service.
func (t *Tracker) DeleteService(namespace, name string) {
	t.update(func(b *batch) { t.deleteService(b, types.NamespacedName{Namespace: namespace, Name: name}) })
}

// SetSlice adds or updates an EndpointSlice.
func (t *Tracker) SetSlice(slice *discoveryv1.EndpointSlice) {
	t.update(func(b *batch) { t.setSlice(b, slice) })
}

// DeleteSlice removes an EndpointSlice.
func (t *Tracker) DeleteSlice(namespace, name string) {
	t.update(func(b *batch) { t.deleteSlice(b, types.NamespacedName{Namespace: namespace, Name: name}) })
}

// SetNode sets this node's Node object; nil forgets it, and the fallback
// node is used again.
func (t *Tracker) SetNode(node *v1.Node) {
	t.update(func(b *batch) { t.setNode(b, node) })
}

// Edit makes the changes f asks of the editor as one: under one lock, with
// one change signal. The manifest source hands over what changed in the
// files it read this way.
func (t *Tracker) Edit(f func(*Editor)) {
	t.update(func(b *batch) { f(&Editor{t: t, b: b}) })
}

// Editor changes a tracker inside Edit; it is valid only there.
type Editor struct {
	t *Tracker
	b *batch
}

// SetService adds or updates a Service.
func (e *Editor) SetService(svc *v1.Service) { e.t.setService(e.b, svc) }

// DeleteService removes a Service.
func (e *Editor) DeleteService(namespace, name string) {
	e.t.deleteService(e.b, keyOf(namespace, name))
}

// SetSlice adds or updates an EndpointSlice.
func (e *Editor) SetSlice(slice *discoveryv1.EndpointSlice) { e.t.setSlice(e.b, slice) }

// DeleteSlice removes an EndpointSlice.
func (e *Editor) DeleteSlice(namespace, name string) { e.t.deleteSlice(e.b, keyOf(namespace, name)) }

// SetNode sets this node's Node object; nil forgets it.
func (e *Editor) SetNode(node *v1.Node) { e.t.setNode(e.b, node) }

// CountInvalid counts a problem the source found and logged itself (a
// manifest file that can't be read), as the tracker counts its own.
func (e *Editor) CountInvalid(kind, namespace, name string, err error) {
	e.b.counted = append(e.b.counted, sourceProblem{kind, namespace, name, err})
}

// ReplaceAll makes the given objects the whole state, as one change: what is
// not among them is deleted.
func (t *Tracker) ReplaceAll(services []*v1.Service, eps []*discoveryv1.EndpointSlice, node *v1.Node) {
	t.update(func(b *batch) {
		keep := map[types.NamespacedName]bool{}
		for _, svc := range services {
			keep[keyOf(svc.Namespace, svc.Name)] = true
			t.setService(b, svc)
		}
		for key := range t.services {
			if !keep[key] {
				t.deleteService(b, key)
			}
		}
		clear(keep)
		for _, s := range eps {
			keep[keyOf(s.Namespace, s.Name)] = true
			t.setSlice(b, s)
		}
		for key := range t.slices {
			if !keep[key] {
				t.deleteSlice(b, key)
			}
		}
		t.setNode(b, node)
	})
}

func keyOf(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// Unchanged objects are neither converted nor reported again. An object
// from the API server is unchanged when it has the version its entry was
// built from (sameVersion). Manifests carry no version and are all read
// again whenever the directory changes: one is unchanged when it yields what
// its entry holds (reread, and the caller compares what it derived).
func sameVersion(entry, obj string) bool { return obj != "" && entry == obj }

// reread tells whether an entry and an object are both from manifests and
// report the same problems.
func reread(entryVersion, objVersion string, entryErrs, errs []error) bool {
	return entryVersion == "" && objVersion == "" &&
		slices.EqualFunc(entryErrs, errs, func(x, y error) bool { return x.Error() == y.Error() })
}

func (t *Tracker) setService(b *batch, svc *v1.Service) {
	key := keyOf(svc.Namespace, svc.Name)
	old := t.services[key]
	if old != nil && sameVersion(old.version, svc.ResourceVersion) {
		return
	}
	ports, errs := ServicePorts(svc)
	e := &serviceEntry{version: svc.ResourceVersion, created: svc.CreationTimestamp, ports: ports, errs: errs}
	if old != nil && reread(old.version, e.version, old.errs, errs) &&
		old.created.Equal(&e.created) && reflect.DeepEqual(old.ports, ports) {
		return
	}
	b.problems = append(b.problems, errs...)
	if len(ports) == 0 && len(errs) == 0 {
		// Ignored (headless, ExternalName, another proxy's): as if deleted.
		t.deleteService(b, key)
		return
	}
	var oldPorts []ServicePort
	if old != nil {
		oldPorts = old.ports
	}
	t.services[key] = e
	if !reflect.DeepEqual(oldPorts, ports) {
		t.stats.ServiceChanges++
		delete(t.merged, key)
		t.servicesDirty = true
		t.portsChanged(key, oldPorts, ports)
		b.changed = true
	} else if old != nil && !old.created.Equal(&e.created) && t.recontest(key, ports) {
		// The age decides who keeps a contested key.
		b.changed = true
	}
}

func (t *Tracker) deleteService(b *batch, key types.NamespacedName) {
	old, ok := t.services[key]
	if !ok {
		return
	}
	delete(t.services, key)
	delete(t.merged, key)
	if len(old.ports) > 0 {
		t.stats.ServiceChanges++
		t.servicesDirty = true
		t.portsChanged(key, old.ports, nil)
		b.changed = true
	}
}

// portsChanged marks the ports of a service's old and new version dirty and
// moves their claims; a key another port claims too, before or after, makes
// the conflicts among its claimants be found again.
func (t *Tracker) portsChanged(key types.NamespacedName, old, new []ServicePort) {
	for i := range old {
		t.dirty[old[i].Name] = struct{}{}
		for _, k := range claimKeys(&old[i]) {
			c := t.claims[k]
			t.contest(&c)
			if c.remove(key); c.len() == 0 {
				delete(t.claims, k)
			} else {
				t.claims[k] = c
			}
		}
	}
	for i := range new {
		t.dirty[new[i].Name] = struct{}{}
		for _, k := range claimKeys(&new[i]) {
			c := t.claims[k]
			c.add(key)
			t.claims[k] = c
			t.contest(&c)
		}
	}
}

// recontest makes the conflicts among the claimants of the service's
// contested keys be found again; it tells whether it had any.
func (t *Tracker) recontest(key types.NamespacedName, ports []ServicePort) bool {
	found := false
	for i := range ports {
		for _, k := range claimKeys(&ports[i]) {
			c := t.claims[k]
			found = t.contest(&c) || found
		}
	}
	return found
}

// contest marks the claimants of a key contested when there are several.
func (t *Tracker) contest(c *claimants) bool {
	if c.len() < 2 {
		return false
	}
	t.contested[c.first] = struct{}{}
	for _, s := range c.more {
		t.contested[s] = struct{}{}
	}
	return true
}

// claimants are the services whose ports claim a key, once per port (a
// service may claim a key twice). The first is held apart: most keys have
// one claimant, and a slice for each would be an allocation per service.
type claimants struct {
	n     int
	first types.NamespacedName
	more  []types.NamespacedName
}

func (c *claimants) len() int { return c.n }

func (c *claimants) add(s types.NamespacedName) {
	if c.n == 0 {
		c.first = s
	} else {
		c.more = append(c.more, s)
	}
	c.n++
}

// remove drops one claim of s; the others keep their order, which does not
// matter: findConflicts orders the services it weighs itself.
func (c *claimants) remove(s types.NamespacedName) {
	switch i := slices.Index(c.more, s); {
	case i >= 0:
		c.more = slices.Delete(c.more, i, i+1)
	case c.n > 0 && c.first == s:
		if last := len(c.more) - 1; last >= 0 {
			c.first, c.more = c.more[last], c.more[:last]
		} else {
			c.first = types.NamespacedName{}
		}
	default:
		return
	}
	c.n--
}

// claimKey is a key findConflicts hands out: an address, protocol and
// port, or a node port (nodePort set, no address).
type claimKey struct {
	vipKey
	nodePort bool
}

func claimKeys(sp *ServicePort) []claimKey {
	var out []claimKey
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range list {
			out = append(out, claimKey{vipKey: vipKey{a, sp.Name.Protocol, sp.Port}})
		}
	}
	if sp.NodePort != 0 {
		out = append(out, claimKey{vipKey: vipKey{proto: sp.Name.Protocol, port: sp.NodePort}, nodePort: true})
	}
	return out
}

func (t *Tracker) setSlice(b *batch, slice *discoveryv1.EndpointSlice) {
	key := keyOf(slice.Namespace, slice.Name)
	old := t.slices[key]
	if old != nil && sameVersion(old.version, slice.ResourceVersion) {
		return
	}
	eps, errs := EndpointsFromSlice(slice)
	if old != nil && reread(old.version, slice.ResourceVersion, old.errs, errs) && old.eps.equal(eps) {
		return
	}
	b.problems = append(b.problems, errs...)
	if eps == nil && len(errs) == 0 {
		t.deleteSlice(b, key)
		return
	}
	e := &sliceEntry{version: slice.ResourceVersion, eps: eps, errs: errs}
	t.unlinkSlice(key, old)
	t.slices[key] = e
	if eps != nil {
		svc := keyOf(eps.Namespace, eps.Service)
		list := t.byService[svc]
		i, _ := slices.BinarySearchFunc(list, eps.Name, func(s *SliceEndpoints, name string) int { return strings.Compare(s.Name, name) })
		t.byService[svc] = slices.Insert(slices.Clip(list), i, eps)
	}
	if old == nil || !old.eps.equal(eps) {
		// Once per event, although it may concern two services.
		if eps != nil || (old != nil && old.eps != nil) {
			t.stats.EndpointChanges++
		}
		var oldEps *SliceEndpoints
		if old != nil {
			oldEps = old.eps
		}
		t.sliceChanged(b, oldEps, eps)
		if eps != nil {
			t.addTrigger(keyOf(eps.Namespace, eps.Service), slice)
		}
	}
}

// addTrigger records the slice's last-change-trigger-time, when it has one
// since the tracker started: the network programming latency of the
// Kubernetes SLI runs from it to the end of the sync that applies the change.
func (t *Tracker) addTrigger(svc types.NamespacedName, slice *discoveryv1.EndpointSlice) {
	s, ok := slice.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.log.Warn("Ignoring an unparsable annotation", zap.String("annotation", v1.EndpointsLastChangeTriggerTime),
			zap.String("service", svc.String()), zap.String("value", s), zap.Error(err))
		return
	}
	if at.After(t.started) {
		t.triggers[svc] = append(t.triggers[svc], TriggerTime{Time: at, IPv6: slice.AddressType == discoveryv1.AddressTypeIPv6})
	}
}

func (t *Tracker) deleteSlice(b *batch, key types.NamespacedName) {
	old, ok := t.slices[key]
	if !ok {
		return
	}
	t.unlinkSlice(key, old)
	delete(t.slices, key)
	if old.eps != nil {
		t.stats.EndpointChanges++
	}
	t.sliceChanged(b, old.eps, nil)
	if old.eps != nil {
		// The annotation of a deleted slice tells when it last changed,
		// not what deleting it took; kube-proxy forgets the service's too.
		delete(t.triggers, keyOf(old.eps.Namespace, old.eps.Service))
	}
}

func (t *Tracker) unlinkSlice(key types.NamespacedName, e *sliceEntry) {
	if e == nil || e.eps == nil {
		return
	}
	svc := keyOf(e.eps.Namespace, e.eps.Service)
	list := slices.DeleteFunc(slices.Clone(t.byService[svc]), func(s *SliceEndpoints) bool { return s.Name == key.Name })
	if len(list) == 0 {
		delete(t.byService, svc)
	} else {
		t.byService[svc] = list
	}
}

// sliceChanged notes that a slice went from old to new (nil: none): the
// merged ports of its service are patched with the one slice when it stays
// with its service, dropped otherwise, and its ports are dirty.
func (t *Tracker) sliceChanged(b *batch, old, new *SliceEndpoints) {
	if old != nil && new != nil && (old.Namespace != new.Namespace || old.Service != new.Service) {
		t.endpointsChanged(b, old, nil)
		t.endpointsChanged(b, nil, new)
		return
	}
	t.endpointsChanged(b, old, new)
}

// endpointsChanged brings the merged ports of the service of old and new
// (one service) along, and marks its ports dirty.
func (t *Tracker) endpointsChanged(b *batch, old, new *SliceEndpoints) {
	of := cmp.Or(new, old)
	if of == nil {
		return
	}
	key := keyOf(of.Namespace, of.Service)
	if !t.patchMerged(key, old, new) {
		delete(t.merged, key)
	}
	if svc := t.services[key]; svc != nil {
		for i := range svc.ports {
			t.dirty[svc.ports[i].Name] = struct{}{}
		}
	}
	b.changed = true
}

func (t *Tracker) setNode(b *batch, node *v1.Node) {
	old := t.node
	if node == nil {
		t.node = nil
		if old != nil {
			t.stats.NodeChanges++
			b.changed = true
		}
		return
	}
	if old != nil && sameVersion(old.version, node.ResourceVersion) {
		return
	}
	n, errs := NodeFrom(node)
	if old != nil && reread(old.version, node.ResourceVersion, old.errs, errs) && reflect.DeepEqual(old.node, n) {
		return
	}
	b.problems = append(b.problems, errs...)
	t.node = &nodeEntry{version: node.ResourceVersion, node: n, errs: errs}
	if old == nil || !reflect.DeepEqual(old.node, n) {
		t.stats.NodeChanges++
		b.changed = true
	}
}

// currentNode is the Node object's view, completed by the fallback.
func (t *Tracker) currentNode() Node {
	if t.node == nil || t.node.node.Name == "" {
		n := t.opts.FallbackNode
		n.Fallback = true
		return n
	}
	n := t.node.node
	if len(n.Addrs) == 0 {
		n.Addrs = t.opts.FallbackNode.Addrs
	}
	return n
}

// Snapshot returns the current desired state. The same pointer is returned
// until something changes; neither the tracker nor the caller may modify it.
func (t *Tracker) Snapshot() *Snapshot {
	t.mu.Lock()
	snap, problems := t.build()
	t.stats.Invalid += uint64(len(problems))
	t.mu.Unlock()
	t.report(problems)
	return snap
}

// build makes the snapshot if there is none; it returns the conflicts that
// were not there in the previous one. The service order and the conflicts
// depend on services only, so an endpoint change reuses them.
func (t *Tracker) build() (*Snapshot, []error) {
	if t.snap != nil {
		return t.snap, nil
	}
	fresh := t.checkConflicts()
	if t.servicesDirty {
		t.sortKeys()
		t.servicesDirty = false
	}
	snap := &Snapshot{Services: make([]ServicePort, 0, t.nPorts), Node: t.currentNode(), ServiceCIDRs: t.allServiceCIDRs()}
	for _, key := range t.keys {
		start := len(snap.Services)
		if m, ok := t.merged[key]; ok {
			snap.Services = append(snap.Services, m...)
		} else {
			// Merged straight into the snapshot: at a start's 100k services
			// a merged copy per service was garbage the first sync made.
			snap.Services = appendWithEndpoints(snap.Services, t.services[key].ports, t.slicesOf(key))
		}
		all, kept := true, start
		for i := start; i < len(snap.Services); i++ {
			if t.skip[snap.Services[i].Name] {
				all = false
				continue
			}
			snap.Services[kept] = snap.Services[i]
			kept++
		}
		snap.Services = snap.Services[:kept]
		if all {
			// The snapshot's copy serves as the merged state from now on:
			// one copy of every port, not two (neither is ever modified).
			end := len(snap.Services)
			t.merged[key] = snap.Services[start:end:end]
		}
	}
	t.snap = snap
	t.forgetSplices()
	return snap, fresh
}

// mergedOf returns the service's ports with their endpoints, merged once
// per change.
func (t *Tracker) mergedOf(key types.NamespacedName) []ServicePort {
	m, ok := t.merged[key]
	if !ok {
		m = WithEndpoints(t.services[key].ports, t.slicesOf(key))
		t.merged[key] = m
	}
	return m
}

// sortKeys orders the services with ports, for a whole snapshot.
func (t *Tracker) sortKeys() {
	t.keys = t.keys[:0]
	t.nPorts = 0
	for key, e := range t.services {
		if len(e.ports) > 0 {
			t.keys = append(t.keys, key)
			t.nPorts += len(e.ports)
		}
	}
	slices.SortFunc(t.keys, func(a, b types.NamespacedName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}

// checkConflicts finds the conflicts again among the contested services and
// those they compete with (a change no other port competes with leaves them
// as they are; the other services keep theirs); the ports whose skipping
// changed become dirty. It returns the conflicts that are new.
func (t *Tracker) checkConflicts() []error {
	if len(t.contested) == 0 {
		return nil
	}
	group := t.contestants()
	old := map[string]bool{}
	oldSkip := map[ServicePortName]bool{}
	forget := func(key types.NamespacedName) {
		for _, c := range t.conflicts[key] {
			old[c.err.Error()] = true
			oldSkip[c.name] = true
			delete(t.skip, c.name)
		}
		delete(t.conflicts, key)
	}
	// A contested service may be gone, or claim nothing contested now:
	// it is not in the group, and its conflicts are over.
	for key := range t.contested {
		forget(key)
	}
	for _, key := range group {
		forget(key)
	}
	clear(t.contested)
	var fresh []error
	for _, c := range t.findConflicts(group) {
		key := keyOf(c.name.Namespace, c.name.Name)
		t.conflicts[key] = append(t.conflicts[key], c)
		t.skip[c.name] = true
		if !oldSkip[c.name] {
			t.dirty[c.name] = struct{}{}
		}
		delete(oldSkip, c.name)
		if !old[c.err.Error()] {
			fresh = append(fresh, c.err)
		}
	}
	for name := range oldSkip {
		t.dirty[name] = struct{}{}
	}
	// A skipped port still claims its keys in claims: a change next to it
	// is contested, and the check runs again.
	return fresh
}

// contestants returns the contested services that have ports and those
// they compete with, directly or through others (the winner of a key may
// be left out for another key, and then lose the first too): all those
// reachable through keys claimed more than once. Whoever wins among them
// depends on them alone.
func (t *Tracker) contestants() []types.NamespacedName {
	seen := map[types.NamespacedName]bool{}
	var group []types.NamespacedName
	visit := func(key types.NamespacedName) {
		if e := t.services[key]; e != nil && len(e.ports) > 0 && !seen[key] {
			seen[key] = true
			group = append(group, key)
		}
	}
	for key := range t.contested {
		visit(key)
	}
	for i := 0; i < len(group); i++ {
		ports := t.services[group[i]].ports
		for j := range ports {
			for _, k := range claimKeys(&ports[j]) {
				if c := t.claims[k]; c.len() > 1 {
					visit(c.first)
					for _, s := range c.more {
						visit(s)
					}
				}
			}
		}
	}
	return group
}

// slicesOf returns the converted slices of a service, sorted by slice name.
func (t *Tracker) slicesOf(key types.NamespacedName) []*SliceEndpoints {
	return t.byService[key]
}

type vipKey struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

// findConflicts finds service ports that claim an address, protocol and
// port (or a node port) another service port already has: the compiler
// would put the same key in a map twice, and the kernel would refuse the
// whole ruleset. The older service keeps the key; among equally old ones
// (manifests have no timestamps) the first by namespace and name; services
// without a timestamp come after those with one. The services given must
// include all those their ports compete with (contestants), in any order.
func (t *Tracker) findConflicts(keys []types.NamespacedName) []portConflict {
	slices.SortFunc(keys, func(a, b types.NamespacedName) int {
		ta, tb := t.services[a].created, t.services[b].created
		// An unknown age does not make a service the older one.
		return cmp.Or(cmp.Compare(boolInt(ta.IsZero()), boolInt(tb.IsZero())), ta.Compare(tb.Time),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	vips := map[vipKey]ServicePortName{}
	nodePorts := map[vipKey]ServicePortName{}
	var out []portConflict
	for _, key := range keys {
		ports := t.services[key].ports
		for i := range ports {
			sp := &ports[i]
			err := claim(sp, vips, nodePorts)
			if err == nil {
				continue
			}
			out = append(out, portConflict{name: sp.Name, err: &ObjectError{Kind: KindService, Namespace: key.Namespace,
				Name: key.Name, Field: "spec.ports", Skipped: portLabel(sp.Name.Port, int32(sp.Port), v1.Protocol(sp.Name.Protocol)),
				Err: err}})
		}
	}
	return out
}

// portConflict is a service port left out for a conflict, and why.
type portConflict struct {
	name ServicePortName
	err  *ObjectError
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// claim records sp's keys, or none of them if one is taken.
func claim(sp *ServicePort, vips, nodePorts map[vipKey]ServicePortName) error {
	var mine []vipKey
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, a := range list {
			k := vipKey{a, sp.Name.Protocol, sp.Port}
			if owner, ok := vips[k]; ok {
				return reasonf(ErrConflict, "%s port %d/%s belongs to %s", a, sp.Port, sp.Name.Protocol, owner)
			}
			mine = append(mine, k)
		}
	}
	np := vipKey{proto: sp.Name.Protocol, port: sp.NodePort}
	if sp.NodePort != 0 {
		if owner, ok := nodePorts[np]; ok {
			return reasonf(ErrConflict, "nodePort %d/%s belongs to %s", sp.NodePort, sp.Name.Protocol, owner)
		}
		nodePorts[np] = sp.Name
	}
	for _, k := range mine {
		vips[k] = sp.Name
	}
	return nil
}

// Skipped lists the current problems: invalid objects or parts of objects,
// and service ports left out for a conflict. Sorted by message.
func (t *Tracker) Skipped() []*ObjectError {
	t.mu.Lock()
	_, problems := t.build()
	t.stats.Invalid += uint64(len(problems))
	var out []*ObjectError
	add := func(errs []error) {
		for _, err := range errs {
			if oe, ok := err.(*ObjectError); ok {
				out = append(out, oe)
			} else {
				out = append(out, &ObjectError{Err: fmt.Errorf("unexpected error: %w", err)})
			}
		}
	}
	for _, e := range t.services {
		add(e.errs)
	}
	for _, e := range t.slices {
		add(e.errs)
	}
	if t.node != nil {
		add(t.node.errs)
	}
	for _, cs := range t.conflicts {
		for _, c := range cs {
			out = append(out, c.err)
		}
	}
	t.mu.Unlock()
	t.report(problems)
	slices.SortFunc(out, func(a, b *ObjectError) int { return cmp.Compare(a.Error(), b.Error()) })
	return out
}
