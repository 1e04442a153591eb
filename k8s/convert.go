package k8s

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// LabelServiceProxyName marks a Service (and its slices) as handled by
// another proxy; kube-proxy and nftproxy leave such services alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// maxAffinitySeconds is the API server's limit on
// sessionAffinityConfig.clientIP.timeoutSeconds.
const maxAffinitySeconds = 86400

// problems collects the errors found in one object.
type problems struct {
	kind, ns, name string
	errs           []error
}

func (p *problems) add(field, skipped string, err error) {
	p.errs = append(p.errs, &ObjectError{Kind: p.kind, Namespace: p.ns, Name: p.name, Field: field, Skipped: skipped, Err: err})
}

// IgnoreReason says why nftproxy leaves a Service alone without it being an
// error, or "" when the service is to be proxied.
func IgnoreReason(svc *v1.Service) string {
	switch {
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return "ExternalName service"
	case svc.Spec.ClusterIP == v1.ClusterIPNone:
		return "headless service"
	}
	if _, ok := svc.Labels[v1.IsHeadlessService]; ok {
		return "headless service"
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return "service of another proxy (" + LabelServiceProxyName + ")"
	}
	return ""
}

// ServicePorts validates a Service and returns one ServicePort per valid
// port, without endpoints, sorted by port name and protocol. A service that
// is ignored (see IgnoreReason) gives neither ports nor errors. An error in a
// field that concerns the whole service skips the service; an error in a port
// skips that port only. Each error is an *ObjectError.
//
// Unset fields mean what the API server would default them to, so manifests
// that never went through an API server work too.
func ServicePorts(svc *v1.Service) ([]ServicePort, []error) {
	if svc == nil || IgnoreReason(svc) != "" {
		return nil, nil
	}
	p := &problems{kind: KindService, ns: svc.Namespace, name: svc.Name}
	base, ok := serviceBase(svc, p)
	if !ok {
		return nil, p.errs
	}
	spec := &svc.Spec
	type protoKey struct {
		s     string
		n     int32
		proto Protocol
	}
	seen := map[protoKey]string{}
	var out []ServicePort
	for i := range spec.Ports {
		sp := &spec.Ports[i]
		field := fmt.Sprintf("spec.ports[%d]", i)
		n := len(p.errs)
		skipped := portLabel(sp.Name, sp.Port, sp.Protocol)
		proto, err := parseProtocol(string(sp.Protocol))
		if err != nil {
			p.add(field+".protocol", skipped, err)
		}
		if err := checkPortName(sp.Name); err != nil {
			p.add(field+".name", skipped, err)
		} else if sp.Name == "" && len(spec.Ports) > 1 {
			p.add(field+".name", skipped, reasonf(ErrMissingField, "a service with several ports must name each"))
		}
		if err := checkPort(sp.Port); err != nil {
			p.add(field+".port", skipped, err)
		}
		if sp.NodePort != 0 {
			if sp.NodePort < 0 || sp.NodePort > 65535 {
				p.add(field+".nodePort", skipped, reasonf(ErrPortRange, "nodePort %d not in 1-65535", sp.NodePort))
			} else if spec.Type != v1.ServiceTypeNodePort && spec.Type != v1.ServiceTypeLoadBalancer {
				p.add(field+".nodePort", skipped, reasonf(ErrInvalidValue, "nodePort on a service of type %s", serviceType(spec.Type)))
			}
		}
		if len(p.errs) > n {
			continue
		}
		// Duplicates would give the compiler two rules for one key; the API
		// server rejects them, manifests may still hold them.
		dup := func(k protoKey, what string) bool {
			if prev, ok := seen[k]; ok {
				p.add(field, skipped, reasonf(ErrDuplicate, "%s also used by %s", what, prev))
				return true
			}
			return false
		}
		if dup(protoKey{s: sp.Name, proto: proto}, fmt.Sprintf("name %q", sp.Name)) ||
			dup(protoKey{n: sp.Port, proto: proto}, fmt.Sprintf("port %d/%s", sp.Port, proto)) ||
			(sp.NodePort != 0 && dup(protoKey{s: "nodePort", n: sp.NodePort, proto: proto}, fmt.Sprintf("nodePort %d/%s", sp.NodePort, proto))) {
			continue
		}
		seen[protoKey{s: sp.Name, proto: proto}] = field
		seen[protoKey{n: sp.Port, proto: proto}] = field
		if sp.NodePort != 0 {
			seen[protoKey{s: "nodePort", n: sp.NodePort, proto: proto}] = field
		}
		out = append(out, base)
		o := &out[len(out)-1]
		o.Name.Port = sp.Name
		o.Name.Protocol = proto
		o.Port = uint16(sp.Port)
		o.NodePort = uint16(sp.NodePort)
	}
	slices.SortFunc(out, func(a, b ServicePort) int { return a.Name.Compare(b.Name) })
	return out, p.errs
}

// serviceBase checks the service-wide fields and returns a ServicePort that
// holds them; ok is false when the service must be skipped.
func serviceBase(svc *v1.Service, p *problems) (base ServicePort, ok bool) {
	n := len(p.errs)
	checkServiceKind(svc, p)
	base.ClusterIPs = serviceClusterIPs(&svc.Spec, p)
	base.ExternalIPs, base.LoadBalancerIPs = serviceExternalIPs(svc, p)
	base.LoadBalancerSourceRanges = sourceRanges(svc.Spec.LoadBalancerSourceRanges, p)
	// An address listed twice would give the compiler one key twice; the
	// kernel refuses such a batch.
	base.ClusterIPs = dedupSorted(base.ClusterIPs)
	base.ExternalIPs = nilIfEmpty(slices.DeleteFunc(dedupSorted(base.ExternalIPs), func(a netip.Addr) bool {
		return slices.Contains(base.ClusterIPs, a)
	}))
	base.LoadBalancerIPs = nilIfEmpty(slices.DeleteFunc(dedupSorted(base.LoadBalancerIPs), func(a netip.Addr) bool {
		return slices.Contains(base.ClusterIPs, a) || slices.Contains(base.ExternalIPs, a)
	}))
	base.LoadBalancerSourceRanges = dedupPrefixes(base.LoadBalancerSourceRanges)
	trafficPolicies(&svc.Spec, &base, p)
	base.AffinityTimeout = affinityTimeout(&svc.Spec, p)
	if td := svc.Spec.TrafficDistribution; td != nil {
		base.TrafficDistribution = *td
	}
	base.Name = ServicePortName{Namespace: svc.Namespace, Name: svc.Name}
	return base, len(p.errs) == n
}

// skipService is the problem's consequence for a service-wide field.
const skipService = "service"

// checkServiceKind checks the names, the type and that there are ports.
func checkServiceKind(svc *v1.Service, p *problems) {
	if err := checkObjectName(svc.Name, validation.IsDNS1035Label); err != nil {
		p.add("metadata.name", skipService, err)
	}
	if err := checkObjectName(svc.Namespace, validation.IsDNS1123Label); err != nil {
		p.add("metadata.namespace", skipService, err)
	}
	switch svc.Spec.Type {
	case "", v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
	default:
		p.add("spec.type", skipService, reasonf(ErrInvalidValue, "unknown type %q", svc.Spec.Type))
	}
	if len(svc.Spec.Ports) == 0 {
		p.add("spec.ports", skipService, reasonf(ErrMissingField, "a service needs at least one port"))
	}
}

// serviceClusterIPs parses clusterIPs (or the older clusterIP): at most
// one per family, the first equal to clusterIP.
func serviceClusterIPs(spec *v1.ServiceSpec, p *problems) []netip.Addr {
	clusterIPs := spec.ClusterIPs
	field := "spec.clusterIPs"
	if len(clusterIPs) == 0 && spec.ClusterIP != "" {
		clusterIPs, field = []string{spec.ClusterIP}, "spec.clusterIP"
	}
	switch {
	case len(clusterIPs) == 0:
		p.add("spec.clusterIP", skipService, reasonf(ErrMissingField, "no cluster IP"))
	case len(clusterIPs) > 2:
		p.add(field, skipService, reasonf(ErrInvalidValue, "%d cluster IPs, at most one per family", len(clusterIPs)))
	case spec.ClusterIP != "" && spec.ClusterIP != clusterIPs[0]:
		p.add(field, skipService, reasonf(ErrInvalidValue, "clusterIPs[0] %q differs from clusterIP %q", clusterIPs[0], spec.ClusterIP))
	}
	var out []netip.Addr
	for i, s := range clusterIPs {
		a, err := parseServiceIP(s, false)
		if err != nil {
			p.add(fmt.Sprintf("%s[%d]", field, i), skipService, err)
			continue
		}
		if len(out) == 1 && out[0].Is4() == a.Is4() {
			p.add(fmt.Sprintf("%s[%d]", field, i), skipService, reasonf(ErrInvalidValue, "two cluster IPs of one family"))
			continue
		}
		out = append(out, a)
	}
	return out
}

// serviceExternalIPs parses the external IPs and, for a load balancer, the
// ingress addresses the load balancer sends to as VIPs.
func serviceExternalIPs(svc *v1.Service, p *problems) (external, loadBalancer []netip.Addr) {
	for i, s := range svc.Spec.ExternalIPs {
		a, err := parseServiceIP(s, true)
		if err != nil {
			p.add(fmt.Sprintf("spec.externalIPs[%d]", i), skipService, err)
			continue
		}
		external = append(external, a)
	}
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return external, nil
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// Hostname-only ingresses have nothing to program; in Proxy
		// mode the load balancer sends to the node, not to the VIP.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
			continue
		}
		a, err := parseServiceIP(ing.IP, false)
		if err != nil {
			p.add(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), skipService, err)
			continue
		}
		loadBalancer = append(loadBalancer, a)
	}
	return external, loadBalancer
}

// sourceRanges parses loadBalancerSourceRanges.
func sourceRanges(ranges []string, p *problems) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range ranges {
		pfx, err := parsePrefix(s)
		if err != nil {
			p.add(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), skipService, err)
			continue
		}
		out = append(out, pfx)
	}
	return out
}

// trafficPolicies sets the external and internal traffic policies and the
// health check node port that goes with eTP=Local on a load balancer.
func trafficPolicies(spec *v1.ServiceSpec, base *ServicePort, p *problems) {
	switch spec.ExternalTrafficPolicy {
	case "", v1.ServiceExternalTrafficPolicyCluster:
	case v1.ServiceExternalTrafficPolicyLocal:
		// Local only changes traffic that comes from outside the cluster.
		base.ExternalPolicyLocal = spec.Type == v1.ServiceTypeNodePort || spec.Type == v1.ServiceTypeLoadBalancer || len(spec.ExternalIPs) > 0
	default:
		p.add("spec.externalTrafficPolicy", skipService, reasonf(ErrInvalidValue, "unknown policy %q", spec.ExternalTrafficPolicy))
	}
	if itp := spec.InternalTrafficPolicy; itp != nil {
		switch *itp {
		case "", v1.ServiceInternalTrafficPolicyCluster:
		case v1.ServiceInternalTrafficPolicyLocal:
			base.InternalPolicyLocal = true
		default:
			p.add("spec.internalTrafficPolicy", skipService, reasonf(ErrInvalidValue, "unknown policy %q", *itp))
		}
	}
	if spec.Type == v1.ServiceTypeLoadBalancer && spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		if hc := spec.HealthCheckNodePort; hc < 0 || hc > 65535 {
			p.add("spec.healthCheckNodePort", skipService, reasonf(ErrPortRange, "%d not in 1-65535", hc))
		} else {
			base.HealthCheckNodePort = uint16(hc)
		}
	}
}

// affinityTimeout is the ClientIP affinity's timeout; 0 without affinity.
func affinityTimeout(spec *v1.ServiceSpec, p *problems) time.Duration {
	switch spec.SessionAffinity {
	case "", v1.ServiceAffinityNone:
		return 0
	case v1.ServiceAffinityClientIP:
		secs := v1.DefaultClientIPServiceAffinitySeconds
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			secs = *c.ClientIP.TimeoutSeconds
		}
		if secs <= 0 || secs > maxAffinitySeconds {
			p.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds", skipService,
				reasonf(ErrInvalidValue, "%d not in 1-%d", secs, maxAffinitySeconds))
		}
		return time.Duration(secs) * time.Second
	}
	p.add("spec.sessionAffinity", skipService, reasonf(ErrInvalidValue, "unknown affinity %q", spec.SessionAffinity))
	return 0
}

func serviceType(t v1.ServiceType) v1.ServiceType {
	if t == "" {
		return v1.ServiceTypeClusterIP
	}
	return t
}

// SliceEndpoints is what one EndpointSlice says about the endpoints of one
// service, per port.
type SliceEndpoints struct {
	Namespace string
	Name      string // the slice's name
	Service   string // the kubernetes.io/service-name label
	Ports     []PortEndpoints
}

// PortEndpoints are the endpoints of one port of a slice; each endpoint
// carries the slice's port number for that port.
type PortEndpoints struct {
	Name      string
	Protocol  Protocol
	Endpoints []Endpoint // sorted by address, then port
}

// equal tells whether two converted slices (nil: none) are the same, as
// Endpoint.Equal compares endpoints: in place, without reflection, which
// cost a slice change of a hundred endpoints more than the rest of the
// tracker's work.
func (s *SliceEndpoints) equal(o *SliceEndpoints) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.Namespace != o.Namespace || s.Name != o.Name || s.Service != o.Service || len(s.Ports) != len(o.Ports) {
		return false
	}
	for i := range s.Ports {
		a, b := &s.Ports[i], &o.Ports[i]
		if a.Name != b.Name || a.Protocol != b.Protocol || len(a.Endpoints) != len(b.Endpoints) {
			return false
		}
		for j := range a.Endpoints {
			if !a.Endpoints[j].Equal(&b.Endpoints[j]) {
				return false
			}
		}
	}
	return true
}

// serves tells whether these are the endpoints of service port name.
func (pe *PortEndpoints) serves(name ServicePortName) bool {
	return pe.Name == name.Port && pe.Protocol == name.Protocol
}

// EndpointsFromSlice validates an EndpointSlice and returns its endpoints per
// port. A bad port or endpoint is skipped with an error; a slice that cannot
// be attributed (no service-name label, unknown address type, no name) is
// skipped whole and gives nil. Slices of FQDN addresses, of headless services
// and of other proxies' services give nil and no error. Like kube-proxy, only
// the first address of an endpoint is used.
func EndpointsFromSlice(slice *discoveryv1.EndpointSlice) (*SliceEndpoints, []error) {
	if ignoredSlice(slice) {
		return nil, nil
	}
	p := &problems{kind: KindEndpointSlice, ns: slice.Namespace, name: slice.Name}
	want, ok := checkSliceKind(slice, p)
	if !ok {
		return nil, p.errs
	}
	eps := sliceEndpoints(slice, want, p)
	out := &SliceEndpoints{Namespace: slice.Namespace, Name: slice.Name, Service: slice.Labels[discoveryv1.LabelServiceName]}
	out.Ports = slicePorts(slice.Ports, eps, p)
	return out, p.errs
}

// ignoredSlice tells whether a slice is none of nftproxy's business: FQDN
// addresses, a headless service's or another proxy's.
func ignoredSlice(slice *discoveryv1.EndpointSlice) bool {
	if slice == nil || slice.AddressType == discoveryv1.AddressTypeFQDN {
		return true
	}
	if _, ok := slice.Labels[v1.IsHeadlessService]; ok {
		return true
	}
	_, ok := slice.Labels[LabelServiceProxyName]
	return ok
}

// checkSliceKind checks what attributes the slice: its names, its service
// label and its address type. want tells the addresses of that type; ok is
// false when the slice must be skipped.
func checkSliceKind(slice *discoveryv1.EndpointSlice, p *problems) (want func(netip.Addr) bool, ok bool) {
	n := len(p.errs)
	const skip = "slice"
	if slice.Name == "" {
		p.add("metadata.name", skip, ErrMissingField)
	}
	if slice.Namespace == "" {
		p.add("metadata.namespace", skip, ErrMissingField)
	}
	if slice.Labels[discoveryv1.LabelServiceName] == "" {
		p.add("metadata.labels", skip, reasonf(ErrMissingField, "no %s label", discoveryv1.LabelServiceName))
	}
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4:
		want = netip.Addr.Is4
	case discoveryv1.AddressTypeIPv6:
		want = netip.Addr.Is6
	default:
		p.add("addressType", skip, reasonf(ErrInvalidValue, "unknown address type %q", slice.AddressType))
	}
	return want, len(p.errs) == n
}

// sliceEndpoints converts the slice's endpoints, without ports, skipping
// those whose first address is missing, bad or not of type want.
func sliceEndpoints(slice *discoveryv1.EndpointSlice, want func(netip.Addr) bool, p *problems) []Endpoint {
	var eps []Endpoint
	for i := range slice.Endpoints {
		e := &slice.Endpoints[i]
		field := fmt.Sprintf("endpoints[%d].addresses", i)
		if len(e.Addresses) == 0 {
			p.add(field, "endpoint", ErrMissingField)
			continue
		}
		a, err := parseEndpointIP(e.Addresses[0])
		if err == nil && !want(a) {
			err = reasonf(ErrInvalidIP, "%s in a slice of address type %s", a, slice.AddressType)
		}
		if err != nil {
			p.add(field+"[0]", "endpoint "+e.Addresses[0], err)
			continue
		}
		eps = append(eps, convertEndpoint(e, a))
	}
	return eps
}

// slicePorts gives the endpoints eps once for each valid port of a slice,
// with that port's number, sorted by port name, then protocol. Of two
// ports with one name and protocol, the first is kept.
func slicePorts(ports []discoveryv1.EndpointPort, eps []Endpoint, p *problems) []PortEndpoints {
	type key struct {
		name  string
		proto Protocol
	}
	seen := map[key]bool{}
	var out []PortEndpoints
	for i := range ports {
		sp := &ports[i]
		field := fmt.Sprintf("ports[%d]", i)
		name := deref(sp.Name)
		skipped := portLabel(name, deref(sp.Port), deref(sp.Protocol))
		proto, ok := checkSlicePort(sp, field, skipped, p)
		if !ok {
			continue
		}
		if seen[key{name, proto}] {
			p.add(field, skipped, reasonf(ErrDuplicate, "port name %q used twice", name))
			continue
		}
		seen[key{name, proto}] = true
		out = append(out, PortEndpoints{Name: name, Protocol: proto, Endpoints: withPort(eps, uint16(*sp.Port))})
	}
	slices.SortFunc(out, func(a, b PortEndpoints) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol))
	})
	return out
}

// checkSlicePort checks a slice port's protocol, name and number; ok is
// false when the port must be skipped.
func checkSlicePort(sp *discoveryv1.EndpointPort, field, skipped string, p *problems) (proto Protocol, ok bool) {
	n := len(p.errs)
	proto, err := parseProtocol(string(deref(sp.Protocol)))
	if err != nil {
		p.add(field+".protocol", skipped, err)
	}
	if err := checkPortName(deref(sp.Name)); err != nil {
		p.add(field+".name", skipped, err)
	}
	if sp.Port == nil {
		p.add(field+".port", skipped, ErrMissingField)
	} else if err := checkPort(*sp.Port); err != nil {
		p.add(field+".port", skipped, err)
	}
	return proto, len(p.errs) == n
}

// withPort is a copy of eps with each endpoint's port set, merged.
func withPort(eps []Endpoint, port uint16) []Endpoint {
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		e.Port = port
		out[i] = e
	}
	return mergeEndpoints(out)
}

func convertEndpoint(e *discoveryv1.Endpoint, a netip.Addr) Endpoint {
	c := e.Conditions
	ready := c.Ready == nil || *c.Ready
	out := Endpoint{
		Addr:        a,
		Ready:       ready,
		Serving:     ready,
		Terminating: c.Terminating != nil && *c.Terminating,
		NodeName:    deref(e.NodeName),
		Zone:        deref(e.Zone),
	}
	if c.Serving != nil {
		out.Serving = *c.Serving
	}
	if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
		out.Hints = &Hints{}
		for _, z := range h.ForZones {
			out.Hints.Zones = append(out.Hints.Zones, z.Name)
		}
		for _, n := range h.ForNodes {
			out.Hints.Nodes = append(out.Hints.Nodes, n.Name)
		}
	}
	return out
}

// WithEndpoints returns copies of ports with the endpoints of the slices that
// belong to them: same namespace, service, port name and protocol. An
// address and port found in several slices (an endpoint moving between
// slices) is kept once, with the best conditions; on a tie the earlier slice
// wins, so pass slices in a stable order. A port's endpoints may be a
// slice's own list: neither may be modified.
func WithEndpoints(ports []ServicePort, from []*SliceEndpoints) []ServicePort {
	return appendWithEndpoints(nil, ports, from)
}

// appendWithEndpoints appends what WithEndpoints returns to dst: a snapshot
// is built in place, not from a copy per service.
func appendWithEndpoints(dst, ports []ServicePort, from []*SliceEndpoints) []ServicePort {
	start := len(dst)
	dst = append(dst, ports...)
	for i := start; i < len(dst); i++ {
		sp := &dst[i]
		ofPort := func(yield func([]Endpoint) bool) {
			for _, s := range from {
				if s == nil || s.Namespace != sp.Name.Namespace || s.Service != sp.Name.Name {
					continue
				}
				for _, pe := range s.Ports {
					if pe.serves(sp.Name) && !yield(pe.Endpoints) {
						return
					}
				}
			}
		}
		// Counted first: a wide service's thousands are copied once.
		n, lists := 0, 0
		var only []Endpoint
		for eps := range ofPort {
			n += len(eps)
			lists++
			only = eps
		}
		if lists == 1 {
			// One slice's list, already in order, is shared, not copied:
			// neither is ever modified in place, and most services have one
			// slice (at 100k services the copies were a sixth of the heap).
			sp.Endpoints = mergeEndpoints(only)
			continue
		}
		eps := make([]Endpoint, 0, n)
		for e := range ofPort {
			eps = append(eps, e...)
		}
		sp.Endpoints = mergeEndpoints(eps)
	}
	return dst
}

// mergeEndpoints sorts endpoints by address and port and keeps the best of
// each address and port; nil when there are none.
func mergeEndpoints(eps []Endpoint) []Endpoint {
	if len(eps) == 0 {
		return nil
	}
	// Strictly increasing (sorted, no address and port twice) is kept as
	// it is; read in place, as the endpoints are large.
	if strictlyIncreasing(eps) {
		return eps
	}
	// Sorted through their indexes, the index breaking ties (the earlier
	// slice wins): moving the endpoints themselves, a wide service's sort
	// was mostly copying.
	order := make([]int32, len(eps))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(i, j int32) int {
		a, b := &eps[i], &eps[j]
		return cmp.Or(compareEndpointKeys(a, b), cmp.Compare(rank(b), rank(a)), cmp.Compare(i, j))
	})
	out := make([]Endpoint, 0, len(eps))
	for _, i := range order {
		e := &eps[i]
		if n := len(out); n > 0 && out[n-1].Addr == e.Addr && out[n-1].Port == e.Port {
			continue
		}
		out = append(out, *e)
	}
	return out
}

// rank orders conditions: ready beats serving beats merely not terminating.
func rank(e *Endpoint) int {
	r := 0
	if e.Ready {
		r += 4
	}
	if e.Serving {
		r += 2
	}
	if !e.Terminating {
		r++
	}
	return r
}

// NodeFrom converts a Node: its InternalIP then ExternalIP addresses, in
// status order and without duplicates; its zone label; a copy of its labels;
// its deletionTimestamp and taints, which decide whether it is drained.
// A bad address is skipped with an error; a node without a name gives the
// zero Node.
func NodeFrom(node *v1.Node) (Node, []error) {
	p := &problems{kind: KindNode, name: node.Name}
	if node.Name == "" {
		p.add("metadata.name", "node", ErrMissingField)
		return Node{}, p.errs
	}
	out := Node{Name: node.Name, Zone: node.Labels[v1.LabelTopologyZone], Labels: maps.Clone(node.Labels)}
	if node.DeletionTimestamp != nil {
		out.Deleting = node.DeletionTimestamp.Time
	}
	for _, t := range node.Spec.Taints {
		out.Taints = append(out.Taints, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
	}
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for i, na := range node.Status.Addresses {
			if na.Type != t {
				continue
			}
			a, err := parseIP(na.Address)
			if err != nil {
				p.add(fmt.Sprintf("status.addresses[%d]", i), "node address", err)
				continue
			}
			if !slices.Contains(out.Addrs, a) {
				out.Addrs = append(out.Addrs, a)
			}
		}
	}
	for i, c := range node.Spec.PodCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			p.add(fmt.Sprintf("spec.podCIDRs[%d]", i), "pod CIDR", err)
			continue
		}
		out.PodCIDRs = append(out.PodCIDRs, pfx.Masked())
	}
	return out, p.errs
}

func parseProtocol(s string) (Protocol, error) {
	switch Protocol(s) {
	case "", TCP:
		return TCP, nil
	case UDP, SCTP:
		return Protocol(s), nil
	}
	return "", reasonf(ErrUnknownProtocol, "%q", s)
}

func checkPort(port int32) error {
	if port < 1 || port > 65535 {
		return reasonf(ErrPortRange, "%d not in 1-65535", port)
	}
	return nil
}

// checkPortName accepts an empty name or a DNS-1123 label.
func checkPortName(name string) error {
	if name == "" {
		return nil
	}
	return checkObjectName(name, validation.IsDNS1123Label)
}

func checkObjectName(name string, valid func(string) []string) error {
	switch {
	case name == "":
		return ErrMissingField
	case len(name) > validation.DNS1123LabelMaxLength:
		return reasonf(ErrNameTooLong, "%d characters, at most %d", len(name), validation.DNS1123LabelMaxLength)
	}
	if msgs := valid(name); len(msgs) > 0 {
		return reasonf(ErrInvalidName, "%q: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

// parseIP accepts a plain IPv4 or IPv6 address; mapped IPv4 and zones are
// refused because their family would be ambiguous in the ruleset.
func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, reasonf(ErrInvalidIP, "%q", s)
	}
	return a, nil
}

// parseServiceIP parses an address traffic is sent to. Like the API server,
// external IPs may not be loopback or link-local either.
func parseServiceIP(s string, external bool) (netip.Addr, error) {
	a, err := parseIP(s)
	if err != nil {
		return a, err
	}
	if a.IsUnspecified() || a.IsMulticast() || (external && (a.IsLoopback() || a.IsLinkLocalUnicast())) {
		return netip.Addr{}, reasonf(ErrInvalidIP, "%s can't be a service address", a)
	}
	return a, nil
}

// parseEndpointIP refuses what the API server refuses in endpoints and what
// DNAT can't reach.
func parseEndpointIP(s string) (netip.Addr, error) {
	a, err := parseIP(s)
	if err != nil {
		return a, err
	}
	if a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
		return netip.Addr{}, reasonf(ErrInvalidIP, "%s can't be an endpoint", a)
	}
	return a, nil
}

// parsePrefix parses a CIDR and clears its host bits, as the API server
// tolerates "10.0.0.1/8".
func parsePrefix(s string) (netip.Prefix, error) {
	pfx, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil || pfx.Addr().Zone() != "" || pfx.Addr().Is4In6() {
		return netip.Prefix{}, reasonf(ErrInvalidPrefix, "%q", s)
	}
	return pfx.Masked(), nil
}

func dedupSorted(as []netip.Addr) []netip.Addr {
	slices.SortFunc(as, netip.Addr.Compare)
	return slices.Compact(as)
}

// nilIfEmpty keeps snapshots comparable with reflect.DeepEqual: no address
// is always nil, never an empty slice.
func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func dedupPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return slices.Compact(ps)
}

func portLabel(name string, port int32, proto v1.Protocol) string {
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	if name != "" {
		return fmt.Sprintf("port %q/%s", name, proto)
	}
	return "port " + strconv.Itoa(int(port)) + "/" + string(proto)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
