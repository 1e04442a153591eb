package main

import (
	"flag"
	"strconv"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// routeKlog sends client-go's klog lines to log, so that an operator's log
// pipeline sees one structured format. klog's verbosity is set to ours (v),
// and its V(n) lines come out at the zap level our -v n enables.
func routeKlog(log *zap.Logger, v int) {
	routeKlogVerbosity(v)
	klog.SetLogger(logr.New(&klogSink{log: log.WithOptions(zap.AddCallerSkip(1)).Named("client-go")}))
}

// routeKlogVerbosity sets klog's -v, which gates its V(n) lines before they
// reach the sink.
func routeKlogVerbosity(v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", strconv.Itoa(v)) // an int always parses
}

// klogSink is a logr.LogSink writing to zap.
type klogSink struct {
	log *zap.Logger
}

func (s *klogSink) Init(logr.RuntimeInfo) {}

func level(v int) zapcore.Level {
	switch {
	case v >= 4:
		return zapcore.DebugLevel - 1
	case v >= 2:
		return zapcore.DebugLevel
	}
	return zapcore.InfoLevel
}

func (s *klogSink) Enabled(v int) bool { return s.log.Core().Enabled(level(v)) }

func (s *klogSink) Info(v int, msg string, kv ...any) {
	if ce := s.log.Check(level(v), msg); ce != nil {
		ce.Write(fields(kv)...)
	}
}

func (s *klogSink) Error(err error, msg string, kv ...any) {
	s.log.Error(msg, append(fields(kv), zap.Error(err))...)
}

func (s *klogSink) WithValues(kv ...any) logr.LogSink {
	return &klogSink{log: s.log.With(fields(kv)...)}
}

func (s *klogSink) WithName(name string) logr.LogSink {
	return &klogSink{log: s.log.Named(name)}
}

// fields turns logr's alternating keys and values into zap fields; a key
// that is not a string, or a missing value, is kept under a made-up key
// rather than dropped.
func fields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, (len(kv)+1)/2)
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			out = append(out, zap.Any("badKey", kv[i]))
			continue
		}
		if i+1 == len(kv) {
			out = append(out, zap.String("missingValueFor", key))
			continue
		}
		out = append(out, zap.Any(key, kv[i+1]))
	}
	return out
}
