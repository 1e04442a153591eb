// Package apiserver runs a real etcd and kube-apiserver on 127.0.0.1 for
// tests and demos, so sources, informers and manifests are exercised against
// the same validation, defaulting and ClusterIP allocation a cluster applies.
//
// The binaries are built from Go modules by build.sh (the tools module next
// to this package pins k8s.io/kubernetes v1.36.3 and etcd v3.6.8) into
// ~/.cache/nftproxy/k8s-v1.36.3, or the directory named by NFTPROXY_K8S_BIN.
// Start returns ErrNotBuilt when they are missing; Require turns that into a
// test skip.
//
// Each Server has its own temporary directory holding certificates made in
// Go (a CA, the serving certificate, an admin client certificate in
// system:masters, a service-account key), etcd's data, a kubeconfig and the
// log of every process. StopAPIServer and StartAPIServer take kube-apiserver
// down and bring it back on the same port with the same etcd, for tests of
// behaviour while the control plane is unreachable; StartControllerManager
// adds a kube-controller-manager running only the controllers a test names.
//
// Child processes get SIGKILL when the test process dies (Pdeathsig), so a
// crashed or timed-out test leaves nothing running.
package apiserver
