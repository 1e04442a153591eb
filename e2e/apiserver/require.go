package apiserver

import (
	"errors"
	"testing"
)

// Require starts a Server for t and stops it when t ends. It skips t when the
// binaries are not built or in -short mode, and fails t when they are built
// but do not start. When t fails, the logs stay in Server.Dir.
func Require(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: needs a real kube-apiserver, which -short leaves out")
	}
	s, err := Start(t.Context(), Options{})
	if errors.Is(err, ErrNotBuilt) {
		t.Skipf("skipping: %v; build them with e2e/apiserver/build.sh or `make k8s-bins`", err)
	}
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.KeepLogs()
			t.Logf("kube-apiserver and etcd logs kept in %s", s.Dir)
		}
		s.Stop()
	})
	return s
}
