package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/api/resource"
)

// logOptions are kube-proxy v1.36's logging flags (component-base's
// logs/api/v1), honoured with zap.
type logOptions struct {
	// format is json, nftproxy's default (its manifests and tests parse the
	// lines), or text; kube-proxy's default is text.
	format         string
	flushFrequency time.Duration
	text, json     logStreams
}

// logStreams are a format's split-stream options.
type logStreams struct {
	splitStream    bool
	infoBufferSize resource.QuantityValue
}

const defaultLogFlushFrequency = 5 * time.Second // component-base's

// maxInfoBuffer caps the info buffer as component-base does.
const maxInfoBuffer = 2 << 30

// logFlags are kept beside --config, as kube-proxy copies the logging flags
// over the file's logging section.
var logFlags = []string{"logging-format", "log-flush-frequency", "log-text-split-stream",
	"log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

func (l *logOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "logging-format", "json", "log format: json (nftproxy's default; kube-proxy's is text) or text (one human-readable line per entry, with the same fields)")
	fs.DurationVar(&l.flushFrequency, "log-flush-frequency", defaultLogFlushFrequency, "longest time buffered info messages wait (see --log-*-info-buffer-size), as kube-proxy's")
	for _, f := range []struct {
		name string
		s    *logStreams
	}{{"text", &l.text}, {"json", &l.json}} {
		fs.BoolVar(&f.s.splitStream, "log-"+f.name+"-split-stream", false,
			"in "+f.name+" format, write info messages to stdout and errors to stderr (default: everything to stderr), as kube-proxy's")
		fs.Var(&f.s.infoBufferSize, "log-"+f.name+"-info-buffer-size",
			"in "+f.name+" format with split streams, buffer up to this much of info messages (a quantity: 512, 1K, 2Ki, 3M); 0 disables buffering")
	}
}

// applyLogFlags checks the logging options as kube-proxy does, and warns
// about those that have no effect with the others.
func (o *options) applyLogFlags() error {
	l := &o.log
	if l.format != "json" && l.format != "text" {
		return fmt.Errorf("--logging-format %q: want json or text", l.format)
	}
	if l.flushFrequency <= 0 {
		return fmt.Errorf("--log-flush-frequency %s: must be greater than zero", l.flushFrequency)
	}
	for _, f := range []struct {
		name string
		s    logStreams
	}{{"text", l.text}, {"json", l.json}} {
		switch {
		case f.name != l.format && (f.s.splitStream || !f.s.infoBufferSize.IsZero()):
			o.warn("--log-%s-split-stream and --log-%s-info-buffer-size have no effect with --logging-format=%s, as in kube-proxy", f.name, f.name, l.format)
		case !f.s.splitStream && !f.s.infoBufferSize.IsZero():
			o.warn("--log-%s-info-buffer-size has no effect without --log-%s-split-stream, as in kube-proxy", f.name, f.name)
		}
	}
	if s := l.streams(); l.flushFrequency != defaultLogFlushFrequency && (!s.splitStream || s.infoBufferSize.Value() <= 0) {
		o.warn("--log-flush-frequency has no effect: nftproxy's log output is unbuffered without --log-%s-info-buffer-size and --log-%s-split-stream", l.format, l.format)
	}
	return nil
}

// streams are the split-stream options of the format in use.
func (l *logOptions) streams() logStreams {
	if l.format == "text" {
		return l.text
	}
	return l.json
}

// newLogger logs to stderr, or with split streams info messages to stdout
// and errors to stderr; -v 2 enables debug, -v 4 also the full ruleset text
// of each sync. stop flushes the buffered info messages and ends their
// periodic flush.
func newLogger(v int, l logOptions, stdout, stderr io.Writer) (log *zap.Logger, stop func()) {
	cfg := zap.NewProductionEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	enc := zapcore.NewJSONEncoder(cfg)
	// component-base's JSON logger sends all but errors to the info stream,
	// its text router only klog's I lines: warnings go to stderr there.
	errLevel := zapcore.ErrorLevel
	if l.format == "text" {
		enc, errLevel = zapcore.NewConsoleEncoder(cfg), zapcore.WarnLevel
	}
	lvl := level(v)
	errOut := zapcore.Lock(zapcore.AddSync(stderr))
	s := l.streams()
	if !s.splitStream {
		return zap.New(zapcore.NewCore(enc, errOut, lvl)), func() {}
	}
	infoOut := zapcore.Lock(zapcore.AddSync(stdout))
	stop = func() {}
	if size := s.infoBufferSize.Value(); size > 0 {
		b := &zapcore.BufferedWriteSyncer{WS: infoOut, Size: int(min(size, maxInfoBuffer)), FlushInterval: l.flushFrequency}
		infoOut, stop = b, func() { _ = b.Stop() }
	}
	core := zapcore.NewTee(
		zapcore.NewCore(enc, errOut, zap.LevelEnablerFunc(func(x zapcore.Level) bool { return x >= errLevel && lvl.Enabled(x) })),
		zapcore.NewCore(enc, infoOut, zap.LevelEnablerFunc(func(x zapcore.Level) bool { return x < errLevel && lvl.Enabled(x) })),
	)
	return zap.New(core), stop
}
