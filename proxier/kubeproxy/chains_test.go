package kubeproxy

import "testing"

func TestIsChain(t *testing.T) {
	for name, want := range map[string]bool{
		"KUBE-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-POSTROUTING": true, "KUBE-MARK-MASQ": true,
		"KUBE-SVC-ABCDEFGHIJKLMNOP": true, "KUBE-SVL-ABCDEFGHIJKLMNOP": true, "KUBE-SEP-ABCDEFGHIJKLMNOP": true,
		"KUBE-FW-ABCDEFGHIJKLMNOP": true, "KUBE-EXT-ABCDEFGHIJKLMNOP": true, "KUBE-XLB-ABCDEFGHIJKLMNOP": true,
		"KUBE-PROXY-FIREWALL": true, "KUBE-FORWARD": true, "KUBE-PROXY-CANARY": true,
		"KUBE-EXTERNAL-SERVICES": true, "KUBE-NODE-PORT": true,
		// kubelet's
		"KUBE-FIREWALL": false, "KUBE-KUBELET-CANARY": false, "KUBE-IPTABLES-HINT": false,
		// others'
		"PREROUTING": false, "CILIUM_POST_nat": false, "KUBE-ROUTER-INPUT": false, "DOCKER": false, "KUBE-SERVICES-X": false,
	} {
		if got := IsChain(name); got != want {
			t.Errorf("IsChain(%q) = %v, want %v", name, got, want)
		}
	}
}
