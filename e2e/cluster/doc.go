// Package cluster runs a whole Kubernetes cluster's data plane in network
// namespaces: one real kube-apiserver (and etcd, from e2e/apiserver), K node
// namespaces each running its own `nftproxy run --kubeconfig` with its own
// Node object, pods on a per-node bridge, a routing fabric between the
// nodes, an external client and a load balancer that health-checks the
// nodes as cloud load balancers do. The namespaces come from
// netns.BuildCluster; the daemons from e2e.Start.
//
// The API server listens on the test process's loopback only; the nodes
// reach it through a relay in the fabric namespace (FabricAddr:6443), so no
// namespace gets a route to the host and nothing is added to the host's
// network namespace.
//
// The tests of this package are the multi-node tier; `make cluster` (cmd/cluster)
// starts the same cluster for people to look at.
package cluster
