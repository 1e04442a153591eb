// Package deploy holds the manifests that run nftproxy on a real cluster: a
// DaemonSet, read-only RBAC, a ServiceAccount and a ConfigMap with the
// KubeProxyConfiguration settings nftproxy honours (kubectl apply -k deploy/),
// plus example Services, EndpointSlices and a Node in examples/ for the
// manifest-directory source and the demo. It has no Go code; its tests decode
// every manifest with client-go's scheme and dry-run them against a real
// kube-apiserver.
package deploy
