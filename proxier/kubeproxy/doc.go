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
// nft backend's chains, Plan over the legacy backend's iptables-save
// output. The nft backend keeps its tables as nftables tables (ip and ip6
// nat, filter, mangle), so its chains go over netlink, in one batch, with
// no iptables tool: nftproxy's image has none. The listing and the batch
// are nftnl's (Conn.Chains, Conn.Jumps, Conn.DeleteRulesAndChains); this
// package only decides. The legacy backend's go with
// its own tools (iptables-legacy-save, -restore) where they are installed;
// where they are not and its tables are loaded, one warning says what may
// be left and how to remove it.
package kubeproxy
