#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kube-proxy (the reference
# proxy for comparisons and migration tests) from the tools module
# next to this script into a cache directory, and does nothing when they are
# already there. Prints the directory on success.
#
#   NFTPROXY_K8S_BIN    cache directory (default ~/.cache/nftproxy/k8s-v1.36.3)
#   NFTPROXY_BUILD_JOBS go build -p value (default 2; lower it if memory is short)
set -euo pipefail

k8s_version=v1.36.3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin_dir="${NFTPROXY_K8S_BIN:-$HOME/.cache/nftproxy/k8s-${k8s_version}}"
bins=(etcd kube-apiserver kube-controller-manager kube-proxy)

have_all() {
	local b
	for b in "${bins[@]}"; do
		[[ -x "$bin_dir/$b" ]] || return 1
	done
}

if have_all; then
	echo "$bin_dir"
	exit 0
fi

mkdir -p "$bin_dir"
# Two test runs may call this at once; the second waits and then finds the binaries.
exec 9>"$bin_dir/.build.lock"
flock 9
if have_all; then
	echo "$bin_dir"
	exit 0
fi

# Build into a scratch directory and move the results in only when all of them
# linked, so an interrupted build never leaves a binary that looks finished.
stage="$(mktemp -d "$bin_dir/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

# Without the version, kubectl and client-go discovery cannot parse the server version.
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=${k8s_version}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=36"

# Static, path-independent binaries from the committed go.sum only.
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
jobs="${NFTPROXY_BUILD_JOBS:-2}"

start=$SECONDS
cd "$here/tools"
echo "building kube-apiserver, kube-controller-manager, kube-proxy, etcd into $bin_dir (takes minutes when cold)" >&2
go build -p "$jobs" -ldflags "$ldflags" -o "$stage/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-proxy
# etcd's main package is its module root, which go build would name "v3".
go build -p "$jobs" -ldflags "-s -w" -o "$stage/etcd" go.etcd.io/etcd/server/v3

for b in "${bins[@]}"; do
	mv -f "$stage/$b" "$bin_dir/$b"
done
echo "built in $((SECONDS - start))s" >&2
echo "$bin_dir"
