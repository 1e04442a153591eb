// Package kubeproxy removes what kube-proxy leaves in a node's network
// namespace when nftproxy takes its place: its nftables tables (`ip
// kube-proxy`, `ip6 kube-proxy`, nftables mode) and its iptables chains with
// the rules that jump to them (iptables mode, legacy or nft backend), in
// nat, filter and mangle. Kubelet's chains (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and everything else stay.
//
// Order matters: when a namespace's last NAT rules go, established NATed
// connections lose their translation and are reset. Replacer deletes
// kube-proxy's table in the batch of nftproxy's first full sync, and its
// iptables chains right after that sync.
//
// Plan, which decides from iptables-save output what goes, is pure; the
// iptables part runs kube-proxy's own tools (iptables-save and
// iptables-restore of the backend) only where kube-proxy's chains exist.
package kubeproxy
