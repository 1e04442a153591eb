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
// What goes is decided by pure functions: PlanNFT over a listing of the
// nft backend's chains, pruneKubeProxy over a legacy table's x_tables
// blob. The nft backend keeps its tables as nftables tables (ip and ip6
// nat, filter, mangle), so its chains go over netlink, in one batch; the
// listing and the batch are nftnl's (Conn.Chains, Conn.Jumps,
// Conn.DeleteRulesAndChains). A legacy table is read and replaced whole
// over a raw socket, as iptables-legacy-restore does (legacy_kernel.go).
// Neither needs an iptables tool: nftproxy's image has none.
package kubeproxy
