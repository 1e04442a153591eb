package kubeproxy

import (
	"slices"
	"strings"
)

// TableName is the name of kube-proxy's nftables table, in the ip and ip6
// families.
const TableName = "kube-proxy"

// chains are kube-proxy's fixed iptables chain names (iptables and ipvs
// modes), chainPrefixes those of its per-service and per-endpoint chains.
var (
	chains = []string{
		"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING",
		"KUBE-MARK-MASQ", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
		"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-LOOP-BACK", "KUBE-IPVS-FILTER",
		"KUBE-IPVS-OUT-FILTER", "KUBE-SOURCE-RANGES-FIREWALL",
	}
	chainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-", "KUBE-XLB-"}
)

// IsChain tells whether an iptables chain is kube-proxy's. Kubelet's
// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT are not.
func IsChain(name string) bool {
	if slices.Contains(chains, name) {
		return true
	}
	for _, p := range chainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// tables are the iptables tables kube-proxy writes to.
var tables = []string{"nat", "filter", "mangle"}
