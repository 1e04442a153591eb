package conformance

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e"
	"github.com/nftproxy/nftproxy/e2e/netns"
)

// imageTag is the tag BuildImage gives nftproxy's image; the nodes' runtime
// knows it as docker.io/library/nftproxy:<tag>, the name the DaemonSet's
// "nftproxy" becomes.
const imageTag = "conformance"

// BuildImage builds the image an operator ships, under the name and tag
// the nodes' runtime is asked for (kubelet asks for the DaemonSet's
// "nftproxy" in full).
func BuildImage(dir string) (string, error) {
	return e2e.BuildImage(dir, "IMAGE_NAME=docker.io/library/nftproxy", "VERSION="+imageTag)
}

// DaemonSet deploys nftproxy as operators do: `kubectl apply -k` of an
// overlay on deploy/ that changes only what this cluster needs (the image
// the nodes imported, never pulled; the API server's address, as kubeadm
// gives kube-proxy a kubeconfig). Options.ExtraImages must hold the image.
func DaemonSet() Proxy {
	return Proxy{Name: "nftproxy (DaemonSet)", Deploy: deployDaemonSet}
}

// daemonSetKubeconfig is kubeadm's kube-proxy kubeconfig: the API server's
// address, and the pod's service account token and CA.
const daemonSetKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: default
  cluster:
    server: https://%s
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
- name: default
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
- name: default
  context: {cluster: default, user: default}
current-context: default
`

const kubeconfigMount = "/var/lib/nftproxy"

// overlayPatch sets the pull policy (the image is imported, not pulled)
// and mounts the kubeconfig; everything else is deploy/'s.
const overlayPatch = `- op: add
  path: /spec/template/spec/initContainers/0/imagePullPolicy
  value: Never
- op: add
  path: /spec/template/spec/containers/0/imagePullPolicy
  value: Never
- op: add
  path: /spec/template/spec/volumes/-
  value: {name: kubeconfig, configMap: {name: nftproxy-kubeconfig}}
- op: add
  path: /spec/template/spec/initContainers/0/volumeMounts/-
  value: {name: kubeconfig, mountPath: ` + kubeconfigMount + `, readOnly: true}
- op: add
  path: /spec/template/spec/containers/0/volumeMounts/-
  value: {name: kubeconfig, mountPath: ` + kubeconfigMount + `, readOnly: true}
`

func deployDaemonSet(ctx context.Context, c *Cluster) error {
	dir := filepath.Join(c.Dir, "deploy-overlay")
	if err := writeOverlay(dir); err != nil {
		return err
	}
	c.logf("kubectl apply -k %s (deploy/ with the image and the API server's address)", dir)
	if out, err := c.Kubectl(ctx, "apply", "-k", dir); err != nil {
		return fmt.Errorf("apply -k deploy overlay: %w: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "daemonset/nftproxy", "--timeout=3m"); err != nil {
		pods, _ := c.Kubectl(ctx, "-n", "kube-system", "describe", "pods", "-l", "app.kubernetes.io/name=nftproxy")
		logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", "daemonset/nftproxy", "--all-containers", "--tail=30")
		return fmt.Errorf("roll out daemonset/nftproxy: %w: %s\n%s\n%s", err, out, pods, logs)
	}
	return nil
}

// writeOverlay writes a kustomization whose base is the repository's
// deploy/ directory.
func writeOverlay(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base, err := filepath.Rel(dir, filepath.Join(e2e.RepoRoot(), "deploy"))
	if err != nil {
		return err
	}
	config, err := shippedConfig()
	if err != nil {
		return err
	}
	// The file's other settings stay as shipped; only the API server's
	// address is this cluster's.
	config += "clientConnection:\n  kubeconfig: " + kubeconfigMount + "/kubeconfig.conf\n"
	api := netip.AddrPortFrom(netns.FabricAddr, apiPort).String()
	files := map[string]string{
		"kubeconfig.conf": fmt.Sprintf(daemonSetKubeconfig, api),
		"config.yaml":     config,
		"patch.yaml":      overlayPatch,
		"kustomization.yaml": fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: kube-system
resources:
- %s
images:
- name: nftproxy
  newTag: %s
configMapGenerator:
- name: nftproxy
  namespace: kube-system
  behavior: replace
  files: [config.yaml]
- name: nftproxy-kubeconfig
  files: [kubeconfig.conf]
generatorOptions:
  disableNameSuffixHash: true
patches:
- path: patch.yaml
  target: {kind: DaemonSet, name: nftproxy}
`, base, imageTag),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// shippedConfig is config.yaml of deploy/configmap.yaml.
func shippedConfig() (string, error) {
	b, err := os.ReadFile(filepath.Join(sourceDir(), "..", "..", "deploy", "configmap.yaml"))
	if err != nil {
		return "", err
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		return "", fmt.Errorf("parse deploy/configmap.yaml: %w", err)
	}
	if cm.Data["config.yaml"] == "" {
		return "", fmt.Errorf("parse deploy/configmap.yaml: no config.yaml")
	}
	return cm.Data["config.yaml"], nil
}

// ContainerProcess finds the process in node n's network namespace whose
// command line starts with args, as the container runtime started it.
func ContainerProcess(n *netns.ClusterNode, args ...string) (int, error) {
	var want syscall.Stat_t
	if err := syscall.Fstat(n.NS.Fd(), &want); err != nil {
		return 0, fmt.Errorf("stat namespace %s: %w", n.Name, err)
	}
	prefix := []byte(strings.Join(args, "\x00"))
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.HasPrefix(cmdline, prefix) {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process %q in %s's network namespace", strings.Join(args, " "), n.Name)
}

// MountOptions are the options of the mount at path in process pid's mount
// namespace (the per-mount ones, from its mountinfo).
func MountOptions(pid int, path string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return "", err
	}
	opts := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// id parent major:minor root mountpoint options ...; the last
		// mount at a path is the one that shows.
		if len(f) > 5 && f[4] == path {
			opts = f[5]
		}
	}
	if opts == "" {
		return "", fmt.Errorf("no mount at %s in process %d", path, pid)
	}
	return opts, nil
}
