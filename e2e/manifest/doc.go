// Package manifest writes Service and EndpointSlice manifests, the YAML a
// `nftproxy run --manifests DIR` reads: the kernel tests' services and the
// benchmark's thousands come from the one template, so both feed the daemon
// the same shape of file.
package manifest
