package proxier

import "fmt"

// Names of everything nftproxy creates. Fixed names are constants; the names
// that depend on an endpoint count are built by the functions below.
const (
	TableName = "nftproxy"

	// Base chains.
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterPrerouting        = "filter-prerouting"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"

	// Regular chains.
	chainServices          = "services"
	chainMarkForMasquerade = "mark-for-masquerade"
	chainMasquerading      = "masquerading"
	chainEndpointsCheck    = "endpoints-check"
	chainReject            = "reject-chain"

	// Sets and maps.
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	setHairpin             = "hairpin"
	// Load balancer source ranges: the address keys that have some, and
	// for each the ranges of allowed sources (key . saddr intervals).
	setFirewallIPs   = "firewall-ips"
	setFirewallAllow = "firewall-allow"
	setClusterIPs    = "cluster-ips"
	// The endpoints of every service port, keyed by the service port and a
	// slot number: the DNAT targets. Lists of wideFrom endpoints or more
	// have maps of their own (see wideFrom).
	mapEndpoints             = "endpoints"
	mapNodePortEndpoints     = "node-port-endpoints"
	mapWideEndpoints         = "endpoints-wide"
	mapWideNodePortEndpoints = "node-port-endpoints-wide"
	// Session affinity: the endpoint each client of a service entry was
	// sent to, which the packet path fills (client . entry : endpoint), and
	// which entries remember it, for how long.
	mapAffinity          = "affinity"
	mapAffinityServices  = "affinity-services"
	mapAffinityNodePorts = "affinity-nodeports"
	chainAffinityCheck   = "affinity-check"

	// The masquerade mark's default, kube-proxy's masqueradeBit 14.
	markMasquerade = 0x4000
)

// Service ports with the same number of endpoints share one chain per kind
// of traffic: it marks for masquerade as that kind needs, then DNATs to a
// random slot's endpoint.
func clusterIPChain(n int) string { return fmt.Sprintf("cluster-ip-%d", n) }
func externalChain(n int) string  { return fmt.Sprintf("external-%d", n) }
func nodePortChain(n int) string  { return fmt.Sprintf("node-port-%d", n) }

// Service ports with externalTrafficPolicy Local share one chain per kind of
// traffic, endpoint count n and local endpoint count local.
func externalLocalChain(n, local int) string {
	return fmt.Sprintf("external-local-%d-%d", n, local)
}
func nodePortLocalChain(n, local int) string { return fmt.Sprintf("node-port-local-%d-%d", n, local) }

// affinityUpdateChain remembers new connections in the affinity map with a
// timeout of secs seconds: one chain per distinct timeout.
func affinityUpdateChain(secs int) string { return fmt.Sprintf("affinity-%d", secs) }
