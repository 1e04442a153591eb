#!/usr/bin/env bash
# One node of the conformance cluster: containerd and kubelet, run inside the
# node's network namespace (ip netns exec NODE_NS unshare --uts node.sh ...),
# with the node's name as hostname, and in a mount namespace of their own, so
# that pod veths, the CNI bridge, pod network namespaces, container mounts and
# the runtimes' state all live and die with the node. Nothing is written outside DIR: /run, /var/lib and /var/log are
# fresh tmpfs mounts in the node's mount namespace only.
#
#   node.sh DIR NAME NODE_IP POD_CIDR KUBECONFIG CGROUP_ROOT IMAGES_DIR KUBELET
#
# Runs until it gets SIGTERM; then stops kubelet and containerd. The caller
# still kills what is left in the node's cgroups and namespace (e2e/conformance).
set -euo pipefail

dir=$1 name=$2 node_ip=$3 pod_cidr=$4 kubeconfig=$5 cgroup_root=$6 images=$7 kubelet=$8

# ip netns exec gave this process a mount namespace with slave propagation:
# nothing mounted here reaches the host's.
mount --make-rslave /
for m in /run /var/lib /var/log; do
	mount -t tmpfs -o mode=0755 "nftproxy-$name" "$m"
done
# ip netns exec mounted a fresh /sys for the namespace, without the cgroup
# hierarchies under it; kubelet and runc need them, as the host has them.
mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
while read -r _ point type opts _; do
	case $type in
	cgroup | cgroup2)
		mkdir -p "$point"
		mount -t "$type" -o "$opts" "$type" "$point"
		;;
	esac
done </proc/1/mounts
mkdir -p /run/netns /run/containerd /var/lib/cni /var/log/containers
# The caller gave this process a UTS namespace of its own (unshare --uts).
hostname "$name"

mkdir -p "$dir/containerd" "$dir/cni" "$dir/kubelet"
gateway="${pod_cidr%.*/*}.1"
cat >"$dir/cni/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$gateway"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.2"
  enable_selinux = false
  disable_apparmor = true
  # Pods' oom_score_adj (the sandbox's -998, Guaranteed containers' -997)
  # need CAP_SYS_RESOURCE, which a sandboxed machine may not have: keep them
  # at or above containerd's own, as rootless setups do.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
EOF

cat >"$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The machine has cgroup v1 and no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: $cgroup_root
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $node_ip
port: 10250
readOnlyPort: 0
# The API server reaches kubelets through the harness's proxy as an admin.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
resolvConf: $dir/resolv.conf
podLogsDir: $dir/pod-logs
failSwapOn: false
# The images were imported and cannot be pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 8760h
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
evictionPressureTransitionPeriod: 5s
serializeImagePulls: false
maxPods: 60
podCIDR: $pod_cidr
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
registerNode: true
EOF
# Pods get the cluster DNS; the node itself needs no resolver.
echo "options ndots:1" >"$dir/resolv.conf"

containerd --config "$dir/containerd/config.toml" >"$dir/containerd.log" 2>&1 &
containerd_pid=$!
for _ in $(seq 100); do
	[[ -S /run/containerd/containerd.sock ]] && break
	sleep 0.1
done
for img in "$images"/*.tar; do
	ctr --address /run/containerd/containerd.sock -n k8s.io images import --all-platforms "$img" >>"$dir/images.log" 2>&1
done

"$kubelet" --config="$dir/kubelet/config.yaml" --kubeconfig="$kubeconfig" \
	--root-dir="$dir/kubelet/root" --hostname-override="$name" --node-ip="$node_ip" \
	--v="${KUBELET_V:-2}" >"$dir/kubelet.log" 2>&1 &
kubelet_pid=$!

stop() {
	kill -TERM "$kubelet_pid" 2>/dev/null || true
	wait "$kubelet_pid" 2>/dev/null || true
	kill -TERM "$containerd_pid" 2>/dev/null || true
	wait "$containerd_pid" 2>/dev/null || true
	exit 0
}
trap stop TERM INT
echo "node $name up: containerd $containerd_pid, kubelet $kubelet_pid"
wait -n "$kubelet_pid" "$containerd_pid" || true
echo "node $name: kubelet or containerd exited" >&2
stop
