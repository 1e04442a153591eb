package main

import (
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/klog/v2"
)

// TestKlogGoesToZap: client-go's klog lines come out as structured zap
// entries, with klog's verbosity mapped to ours.
func TestKlogGoesToZap(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	routeKlog(zap.New(core), 2)
	defer func() {
		klog.ClearLogger()
		routeKlogVerbosity(0)
	}()

	klog.InfoS("Watch ended", "resource", "services", "odd")
	klog.V(2).InfoS("Listing", "resource", "nodes")
	klog.V(4).InfoS("Too chatty") // above -v 2
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "resource", "endpointslices")
	klog.Flush()

	type line struct {
		level  zapcore.Level
		msg    string
		fields map[string]any
	}
	want := []line{
		{zapcore.InfoLevel, "Watch ended", map[string]any{"resource": "services", "missingValueFor": "odd"}},
		{zapcore.DebugLevel, "Listing", map[string]any{"resource": "nodes"}},
		{zapcore.ErrorLevel, "Failed to watch", map[string]any{"resource": "endpointslices", "error": "connection refused"}},
	}
	got := logs.All()
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Level != w.level || e.Message != w.msg || e.LoggerName != "client-go" {
			t.Errorf("entry %d: %s %q from %q, want %s %q from client-go", i, e.Level, e.Message, e.LoggerName, w.level, w.msg)
		}
		for k, v := range w.fields {
			if e.ContextMap()[k] != v {
				t.Errorf("entry %d: field %s = %v, want %v", i, k, e.ContextMap()[k], v)
			}
		}
	}
}
