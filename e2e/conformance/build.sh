#!/usr/bin/env bash
# Builds what the real-node conformance run needs beyond e2e/apiserver/build.sh,
# offline, into a cache directory, and does nothing for a part already there:
#
#   programs  kubelet, kube-scheduler, kubectl, agnhost and e2e.test from the
#             tools module of e2e/apiserver (Kubernetes v1.36.3), CoreDNS from
#             its own module
#   images    OCI archives under the exact names the suite asks for: pause from
#             its C source (gcc -static), agnhost on a minimal Debian root
#             (mmdebstrap) with the tools the tests exec, busybox, CoreDNS;
#             packed with buildah as `make image` does
#
# Installs the Debian packages it needs (buildah, mmdebstrap, busybox-static)
# when they are missing. Prints the directory on success.
#
#   NFTPROXY_CONFORMANCE_BIN  cache directory (default ~/.cache/nftproxy/conformance-v1.36.3)
#   NFTPROXY_BUILD_JOBS       go build -p value (default 2)
set -euo pipefail

k8s_version=v1.36.3
coredns_version=v1.14.7
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tools="$here/../apiserver/tools"
out="${NFTPROXY_CONFORMANCE_BIN:-$HOME/.cache/nftproxy/conformance-${k8s_version}}"
jobs="${NFTPROXY_BUILD_JOBS:-2}"

# The image names and tags e2e.test v1.36.3 and kubelet v1.36.3 use
# (test/utils/image/manifest.go, cmd/kubelet/app/options/container_runtime.go).
declare -A images=(
	[pause]=registry.k8s.io/pause:3.10.2
	[agnhost]=registry.k8s.io/e2e-test-images/agnhost:2.63.0
	[busybox]=registry.k8s.io/e2e-test-images/busybox:1.37.0-1
	[coredns]=registry.k8s.io/coredns/coredns:${coredns_version}
	# The Conntrack invalid-state spec's server (raw sockets, Go).
	[regression-issue-74839]=registry.k8s.io/e2e-test-images/regression-issue-74839:1.4
)

mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
stage="$(mktemp -d "$out/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

need_pkg() { # package command
	command -v "$2" >/dev/null && return
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends "$1" >/dev/null 2>&1 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "$1" >/dev/null; }
}

ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=${k8s_version}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=36"
export CGO_ENABLED=0

programs() {
	local missing=() b
	for b in kubelet kube-scheduler kubectl agnhost regression-issue-74839; do
		[[ -x "$out/$b" ]] || missing+=("$b")
	done
	cd "$tools"
	if [[ ${#missing[@]} -gt 0 ]]; then
		echo "building ${missing[*]} (minutes when cold)" >&2
		local pkgs=() p
		for p in "${missing[@]}"; do
			case $p in
			agnhost | regression-issue-74839) pkgs+=("k8s.io/kubernetes/test/images/$p") ;;
			*) pkgs+=("k8s.io/kubernetes/cmd/$p") ;;
			esac
		done
		GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go build -p "$jobs" -ldflags "$ldflags" -o "$stage/" "${pkgs[@]}"
		for p in "${missing[@]}"; do mv -f "$stage/$p" "$out/$p"; done
	fi
	if [[ ! -x "$out/e2e.test" ]]; then
		echo "building e2e.test (about ten minutes when cold)" >&2
		GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go test -c -p "$jobs" -ldflags "$ldflags" -o "$stage/e2e.test" k8s.io/kubernetes/test/e2e
		mv -f "$stage/e2e.test" "$out/e2e.test"
	fi
	if [[ ! -x "$out/ginkgo" ]]; then
		# The ginkgo CLI runs e2e.test in parallel processes (Options.Procs).
		GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go build -p "$jobs" -o "$stage/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
		mv -f "$stage/ginkgo" "$out/ginkgo"
	fi
	if [[ ! -x "$out/coredns" ]]; then
		echo "building coredns ${coredns_version}" >&2
		# Its own module and go.sum: go install pkg@version builds it as released.
		GOFLAGS="-trimpath -buildvcs=false" GOBIN="$stage" go install -ldflags "-s -w" "github.com/coredns/coredns@${coredns_version}"
		mv -f "$stage/coredns" "$out/coredns"
	fi
}

buildah_() {
	buildah --storage-driver vfs --root "$out/image/storage" --runroot "$out/image/run" "$@"
}

# pack NAME ROOTFS ENTRYPOINT...: an OCI archive $out/images/NAME.tar of ROOTFS.
pack() {
	local name=$1 rootfs=$2
	shift 2
	local entry
	entry="$(printf '"%s",' "$@")"
	local c
	c="$(buildah_ from scratch)"
	buildah_ copy "$c" "$rootfs" / >/dev/null
	buildah_ config --entrypoint "[${entry%,}]" "$c"
	buildah_ commit --quiet --format oci "$c" "${images[$name]}" >/dev/null
	buildah_ rm "$c" >/dev/null
	buildah_ push --quiet "${images[$name]}" "oci-archive:$stage/$name.tar:${images[$name]}"
	buildah_ rmi "${images[$name]}" >/dev/null
	mv -f "$stage/$name.tar" "$out/images/$name.tar"
}

build_images() {
	mkdir -p "$out/images"
	local root
	if [[ ! -s "$out/images/pause.tar" ]]; then
		root="$stage/pause-root"
		mkdir -p "$root"
		local src
		src="$(cd "$tools" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
		gcc -Os -static -Wall -Werror -DVERSION=v3.10.2 -o "$root/pause" "$src"
		strip "$root/pause"
		pack pause "$root" /pause
	fi
	if [[ ! -s "$out/images/busybox.tar" ]]; then
		need_pkg busybox-static busybox
		root="$stage/busybox-root"
		mkdir -p "$root/bin" "$root/tmp" "$root/etc"
		cp /bin/busybox "$root/bin/busybox"
		local applet
		for applet in $("$root/bin/busybox" --list); do
			[[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
		done
		echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
		pack busybox "$root" /bin/sh
	fi
	# What the tests exec in agnhost pods (upstream's image is Alpine with
	# busybox; verifyServeHostnameServiceUp runs wget). A changed list
	# rebuilds the image.
	local agnhost_pkgs=bash,curl,wget,netcat-openbsd,iproute2,bind9-dnsutils,ca-certificates
	if [[ ! -s "$out/images/agnhost.tar" || "$(cat "$out/images/agnhost.pkgs" 2>/dev/null)" != "$agnhost_pkgs" ]]; then
		need_pkg mmdebstrap mmdebstrap
		root="$stage/agnhost-root"
		# The host's apt sources and suite: nothing here names a mirror.
		local suite
		suite="$(. /etc/os-release && echo "$VERSION_CODENAME")"
		mmdebstrap --quiet --variant=minbase --include="$agnhost_pkgs" "$suite" "$root"
		rm -rf "$root/var/cache/apt/"* "$root/var/lib/apt/lists/"*
		cp "$out/agnhost" "$root/agnhost"
		pack agnhost "$root" /agnhost
		echo "$agnhost_pkgs" >"$out/images/agnhost.pkgs"
	fi
	if [[ ! -s "$out/images/coredns.tar" ]]; then
		root="$stage/coredns-root"
		mkdir -p "$root"
		cp "$out/coredns" "$root/coredns"
		pack coredns "$root" /coredns
	fi
	if [[ ! -s "$out/images/regression-issue-74839.tar" ]]; then
		root="$stage/regression-root"
		mkdir -p "$root"
		cp "$out/regression-issue-74839" "$root/regression-issue-74839"
		pack regression-issue-74839 "$root" /regression-issue-74839
	fi
	rm -rf "$out/image"
}

start=$SECONDS
need_pkg buildah buildah
programs
build_images
echo "conformance parts ready in $((SECONDS - start))s" >&2
echo "$out"
