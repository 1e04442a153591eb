// Package prom reads a proxy's Prometheus /metrics page: it fetches the page
// from inside the proxy's network namespace and finds series, histograms and
// gauges in it. The kernel tests and the benchmark program (cmd/bench) read
// nftproxy's and kube-proxy's metrics through it, so both agree on what a
// series means (kube-proxy's ip_family label, say).
package prom
