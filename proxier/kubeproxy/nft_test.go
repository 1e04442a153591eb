package kubeproxy

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/nftmodel"
)

func TestPlanNFT(t *testing.T) {
	v4, v6 := nftmodel.IPv4, nftmodel.IPv6
	jump := func(handle uint64, target string) NFTJump { return NFTJump{Handle: handle, Target: target} }
	// What iptables-nft keeps after kube-proxy's iptables mode and kubelet,
	// beside another program's chains, as the kernel lists it.
	listing := []NFTChain{
		{Family: v4, Table: "mangle", Name: "PREROUTING"},
		{Family: v4, Table: "mangle", Name: "KUBE-IPTABLES-HINT"},
		{Family: v4, Table: "mangle", Name: "KUBE-KUBELET-CANARY"},
		{Family: v4, Table: "mangle", Name: "KUBE-PROXY-CANARY"},
		{Family: v4, Table: "filter", Name: "INPUT", Jumps: []NFTJump{
			jump(4, "KUBE-PROXY-FIREWALL"), jump(5, "KUBE-NODEPORTS"), jump(6, "KUBE-FIREWALL"), jump(7, "OTHER")}},
		{Family: v4, Table: "filter", Name: "FORWARD", Jumps: []NFTJump{jump(9, "KUBE-FORWARD")}},
		{Family: v4, Table: "filter", Name: "OUTPUT", Jumps: []NFTJump{jump(12, "KUBE-SERVICES"), jump(13, "KUBE-FIREWALL")}},
		{Family: v4, Table: "filter", Name: "KUBE-FIREWALL"},
		{Family: v4, Table: "filter", Name: "KUBE-FORWARD"},
		{Family: v4, Table: "filter", Name: "KUBE-NODEPORTS"},
		{Family: v4, Table: "filter", Name: "KUBE-PROXY-FIREWALL"},
		{Family: v4, Table: "filter", Name: "KUBE-SERVICES"},
		// Another program's chain going to kube-proxy's.
		{Family: v4, Table: "filter", Name: "OTHER", Jumps: []NFTJump{jump(20, "KUBE-SERVICES"), jump(21, "OTHER-2")}},
		{Family: v4, Table: "filter", Name: "OTHER-2"},
		{Family: v4, Table: "nat", Name: "PREROUTING", Jumps: []NFTJump{jump(3, "KUBE-SERVICES")}},
		{Family: v4, Table: "nat", Name: "POSTROUTING", Jumps: []NFTJump{jump(8, "KUBE-POSTROUTING"), jump(9, "OTHER-POST")}},
		{Family: v4, Table: "nat", Name: "OUTPUT", Jumps: []NFTJump{jump(5, "KUBE-SERVICES")}},
		{Family: v4, Table: "nat", Name: "KUBE-SERVICES"},
		{Family: v4, Table: "nat", Name: "KUBE-SVC-LOLE4ISW44XBNF3G"},
		{Family: v4, Table: "nat", Name: "KUBE-POSTROUTING"},
		{Family: v4, Table: "nat", Name: "OTHER-POST"},
		// kube-proxy never writes raw: a chain of that name there is not its.
		{Family: v4, Table: "raw", Name: "KUBE-SERVICES"},
		{Family: v4, Table: "raw", Name: "PREROUTING", Jumps: []NFTJump{jump(2, "KUBE-SERVICES")}},
		{Family: v6, Table: "nat", Name: "PREROUTING", Jumps: []NFTJump{jump(2, "KUBE-SERVICES")}},
		{Family: v6, Table: "nat", Name: "KUBE-SERVICES"},
		// A jump to a chain of kube-proxy's name in another table is not
		// a jump to this table's.
		{Family: v6, Table: "filter", Name: "INPUT", Jumps: []NFTJump{jump(2, "KUBE-SERVICES")}},
	}
	want := NFTPlan{
		Rules: []NFTRule{
			{v4, "filter", "FORWARD", 9},
			{v4, "filter", "INPUT", 4},
			{v4, "filter", "INPUT", 5},
			{v4, "filter", "OTHER", 20},
			{v4, "filter", "OUTPUT", 12},
			{v4, "nat", "OUTPUT", 5},
			{v4, "nat", "POSTROUTING", 8},
			{v4, "nat", "PREROUTING", 3},
			{v6, "nat", "PREROUTING", 2},
		},
		Chains: []NFTChain{
			{Family: v4, Table: "filter", Name: "KUBE-FORWARD"},
			{Family: v4, Table: "filter", Name: "KUBE-NODEPORTS"},
			{Family: v4, Table: "filter", Name: "KUBE-PROXY-FIREWALL"},
			{Family: v4, Table: "filter", Name: "KUBE-SERVICES"},
			{Family: v4, Table: "mangle", Name: "KUBE-PROXY-CANARY"},
			{Family: v4, Table: "nat", Name: "KUBE-POSTROUTING"},
			{Family: v4, Table: "nat", Name: "KUBE-SERVICES"},
			{Family: v4, Table: "nat", Name: "KUBE-SVC-LOLE4ISW44XBNF3G"},
			{Family: v6, Table: "nat", Name: "KUBE-SERVICES"},
		},
	}
	got := PlanNFT(listing)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PlanNFT (-want +got):\n%s", diff)
	}
	wantRemoved := []string{
		"iptables-nft: filter/KUBE-FORWARD", "iptables-nft: filter/KUBE-NODEPORTS", "iptables-nft: filter/KUBE-PROXY-FIREWALL",
		"iptables-nft: filter/KUBE-SERVICES", "iptables-nft: mangle/KUBE-PROXY-CANARY", "iptables-nft: nat/KUBE-POSTROUTING",
		"iptables-nft: nat/KUBE-SERVICES", "iptables-nft: nat/KUBE-SVC-LOLE4ISW44XBNF3G", "ip6tables-nft: nat/KUBE-SERVICES",
	}
	if diff := cmp.Diff(wantRemoved, got.Removed()); diff != "" {
		t.Errorf("Removed (-want +got):\n%s", diff)
	}
}

func TestPlanNFTNothing(t *testing.T) {
	for name, listing := range map[string][]NFTChain{
		"empty": nil,
		"kubelet only": {
			{Family: nftmodel.IPv4, Table: "filter", Name: "INPUT", Jumps: []NFTJump{{Handle: 2, Target: "KUBE-FIREWALL"}}},
			{Family: nftmodel.IPv4, Table: "filter", Name: "KUBE-FIREWALL"},
			{Family: nftmodel.IPv4, Table: "mangle", Name: "KUBE-KUBELET-CANARY"},
		},
		"another program's table": {{Family: nftmodel.IPv4, Table: "other", Name: "KUBE-SERVICES"}},
	} {
		if p := PlanNFT(listing); !p.Empty() {
			t.Errorf("%s: PlanNFT = %+v, want nothing", name, p)
		}
	}
}
