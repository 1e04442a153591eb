package k8s

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Protocol is a service port's transport protocol.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Number returns the IP protocol number.
func (p Protocol) Number() uint8 {
	switch p {
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 6
}

// ServicePortName identifies one port of one service.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; may be empty for single-port services
	Protocol  Protocol
}

// Compare orders service port names as snapshots are sorted: by namespace,
// name, port name, then protocol.
func (n ServicePortName) Compare(b ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, b.Namespace), cmp.Compare(n.Name, b.Name),
		cmp.Compare(n.Port, b.Port), cmp.Compare(n.Protocol, b.Protocol))
}

// String prints namespace/name:port (namespace/name for an unnamed port),
// kube-proxy's notation.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return fmt.Sprintf("%s/%s:%s", n.Namespace, n.Name, n.Port)
}

// Endpoint is one backend address of a service port, with its conditions.
type Endpoint struct {
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	// Hints are the topology hints of the EndpointSlice; nil when it has
	// none. (Behind a pointer: most endpoints have none, and the endpoint,
	// copied by thousands for a wide service, is a third smaller.)
	Hints *Hints
}

// Equal compares two endpoints in place: they are large, and a wide service
// has thousands.
func (e *Endpoint) Equal(b *Endpoint) bool {
	return e.Addr == b.Addr && e.Port == b.Port && e.Ready == b.Ready && e.Serving == b.Serving &&
		e.Terminating == b.Terminating && e.NodeName == b.NodeName && e.Zone == b.Zone &&
		slices.Equal(e.ZoneHints(), b.ZoneHints()) && slices.Equal(e.NodeHints(), b.NodeHints())
}

// Hints are the zones and the nodes an endpoint is meant for.
type Hints struct {
	Zones []string
	Nodes []string
}

// ZoneHints returns the zones the endpoint is meant for.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the nodes the endpoint is meant for.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// ServicePort is everything the proxier needs to know about one port of one
// service, already validated. Addresses of both families may be present; the
// compiler picks the ones of the family it compiles.
type ServicePort struct {
	Name                     ServicePortName
	ClusterIPs               []netip.Addr
	Port                     uint16
	NodePort                 uint16 // 0 when none
	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix
	ExternalPolicyLocal      bool
	InternalPolicyLocal      bool
	HealthCheckNodePort      uint16
	AffinityTimeout          time.Duration // > 0 for sessionAffinity ClientIP
	TrafficDistribution      string
	Endpoints                []Endpoint // sorted by address, then port
}

// Node is what the proxier knows about the node it runs on.
type Node struct {
	Name  string
	Addrs []netip.Addr
	// PodCIDRs are the Node's spec.podCIDRs (detectLocalMode NodeCIDR).
	PodCIDRs []netip.Prefix
	Zone     string
	Labels   map[string]string
	// Deleting is the Node object's deletionTimestamp; zero while it is not
	// being deleted.
	Deleting time.Time
	// Taints are the Node object's taints, in its order.
	Taints []Taint
	// Fallback: there is no Node object; Name and Addrs come from the
	// flags (TrackerOptions.FallbackNode).
	Fallback bool
}

// Taint is one taint of a Node.
type Taint struct {
	Key, Value, Effect string
}

// TaintToBeDeleted is the taint the Cluster Autoscaler puts on a node it is
// about to remove; kube-proxy's /healthz fails on it so that load balancers
// drain the node first (KEP-3836).
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// Eligible tells whether load balancers should send traffic to this node,
// as kube-proxy's /healthz decides (KEP-3836): not while its Node object is
// being deleted or carries TaintToBeDeleted. Without a Node object the node
// is eligible: whether that is acceptable depends on the source (see
// proxier.Health).
func (n *Node) Eligible() bool {
	if !n.Deleting.IsZero() {
		return false
	}
	for _, t := range n.Taints {
		if t.Key == TaintToBeDeleted {
			return false
		}
	}
	return true
}

// Snapshot is an immutable view of the desired state. Services are sorted by
// name (namespace, name, port name, protocol). Consumers must not modify it.
type Snapshot struct {
	Services []ServicePort
	Node     Node
	// ServiceCIDRs are the ranges of the cluster's ServiceCIDR objects,
	// sorted: ClusterIPs come from them.
	ServiceCIDRs []netip.Prefix
}
