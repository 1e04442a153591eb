package proxier

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo is kubernetes_build_info as Kubernetes components serve it, a
// constant 1 labelled with the build: here nftproxy's version and commit
// (set at build time), and what the Go toolchain recorded.
func BuildInfo(version, commit string) prometheus.Collector {
	bi, _ := debug.ReadBuildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kubernetes_build_info",
		Help: "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, " +
			"Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
		ConstLabels: buildLabels(version, commit, bi)})
	g.Set(1)
	return g
}

// buildLabels makes the labels: major and minor from a vX.Y… version,
// the tree state and date from the VCS stamp when the build has one.
func buildLabels(version, commit string, bi *debug.BuildInfo) prometheus.Labels {
	l := prometheus.Labels{"major": "", "minor": "", "git_version": version, "git_commit": commit,
		"git_tree_state": "", "build_date": "", "go_version": runtime.Version(), "compiler": runtime.Compiler,
		"platform": runtime.GOOS + "/" + runtime.GOARCH}
	if v, ok := strings.CutPrefix(version, "v"); ok {
		parts := strings.SplitN(v, ".", 3)
		if len(parts) >= 2 {
			l["major"], l["minor"] = parts[0], parts[1]
		}
	}
	if bi == nil {
		return l
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if commit == "" || commit == "unknown" {
				l["git_commit"] = s.Value
			}
		case "vcs.modified":
			l["git_tree_state"] = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
		case "vcs.time":
			l["build_date"] = s.Value
		}
	}
	return l
}
