#!/usr/bin/env bash
# Checks and installs what `make demo` and `make test` need on a Debian
# machine with Go: root, the nftables, iptables, conntrack and iproute2
# packages (make test also prometheus, for promtool, and buildah; apt-get,
# with an update first only when one is missing), the br_netfilter module
# when it can be loaded, and network namespaces that work. Idempotent: a
# second run installs nothing. When the tests can't run here it prints one
# line saying why and exits 1.
#
#   e2e/deps.sh TARGET    TARGET names the make target in the messages
set -euo pipefail

target="${1:-test}"
fail() {
	echo "make $target: $*" >&2
	exit 1
}

[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces, nftables); \`make unit\` runs the tests that need neither root nor an API server"

# package → a command it provides
declare -A packages=([nftables]=nft [iptables]=iptables [conntrack]=conntrack [iproute2]=ip)
# make test also checks the metrics rules (promtool) and builds the image (buildah).
if [[ $target == test ]]; then
	packages+=([prometheus]=promtool [buildah]=buildah)
fi
missing=()
for pkg in "${!packages[@]}"; do
	command -v "${packages[$pkg]}" >/dev/null || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	command -v apt-get >/dev/null || fail "needs ${missing[*]}, and there is no apt-get to install them with"
	echo "installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || fail "apt-get update failed; install ${missing[*]} by hand"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || fail "apt-get install ${missing[*]} failed"
fi

# Pods reaching a ClusterIP over the bridge need bridge netfilter; the tests
# that need it skip with a message when it can't be had (a container).
if [[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
	modprobe br_netfilter 2>/dev/null || echo "note: br_netfilter not loaded; the bridge hairpin tests will skip" >&2
fi

probe="nftproxy-deps-$$"
if ! out=$(ip netns add "$probe" 2>&1); then
	fail "cannot create a network namespace: ${out//$'\n'/ }"
fi
ip netns delete "$probe"
