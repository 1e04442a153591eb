package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogFlags: kube-proxy's logging flags are accepted with its meaning;
// those that have no effect with the others are warned about by name.
func TestLogFlags(t *testing.T) {
	tests := []struct {
		args          []string
		err, warning  string
		format        string
		split         bool
		bufferedBytes int64
	}{
		{args: nil, format: "json"},
		{args: []string{"--logging-format=text"}, format: "text"},
		{args: []string{"--logging-format=xml"}, err: `--logging-format "xml"`},
		{args: []string{"--log-flush-frequency=0s"}, err: "--log-flush-frequency"},
		{args: []string{"--log-json-split-stream", "--log-json-info-buffer-size=1Ki"}, format: "json", split: true, bufferedBytes: 1024},
		{args: []string{"--logging-format=text", "--log-text-split-stream"}, format: "text", split: true},
		{args: []string{"--log-text-split-stream"}, format: "json", warning: "--log-text-split-stream and --log-text-info-buffer-size have no effect with --logging-format=json"},
		{args: []string{"--log-json-info-buffer-size=1M"}, format: "json", bufferedBytes: 1000000, warning: "--log-json-info-buffer-size has no effect without --log-json-split-stream"},
		{args: []string{"--log-flush-frequency=1s"}, format: "json", warning: "--log-flush-frequency has no effect"},
	}
	for _, tt := range tests {
		var o options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.register(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		err := o.applyLogFlags()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: error %v, want one with %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		s := o.log.streams()
		if o.log.format != tt.format || s.splitStream != tt.split || s.infoBufferSize.Value() != tt.bufferedBytes {
			t.Errorf("%q: format %s split %v buffer %d, want %s %v %d", tt.args, o.log.format, s.splitStream, s.infoBufferSize.Value(), tt.format, tt.split, tt.bufferedBytes)
		}
		if tt.warning != "" && !hasWarning(o, tt.warning) {
			t.Errorf("%q: warnings %q, want one with %q", tt.args, o.warnings, tt.warning)
		}
		if tt.warning == "" && len(o.warnings) > 0 {
			t.Errorf("%q: warnings %q, want none", tt.args, o.warnings)
		}
	}
}

// TestLoggerStreams: text is zap's console lines, JSON its objects; split
// streams send info to stdout and errors to stderr (text: warnings too, as
// component-base's text router), buffered info reaching stdout on stop.
func TestLoggerStreams(t *testing.T) {
	tests := []struct {
		name                 string
		args                 []string
		wantOut, wantErr     []string // substrings, in order
		notInOut, notInErr   string
		infoBeforeStopAbsent bool
	}{
		{name: "json one stream", args: nil, wantErr: []string{`"msg":"hello"`, `"msg":"oops"`}, notInOut: "hello"},
		{name: "text one stream", args: []string{"--logging-format=text"}, wantErr: []string{"info\thello\t{\"n\": 1}", "error\toops"}, notInErr: `"msg"`},
		{name: "json split", args: []string{"--log-json-split-stream"}, wantOut: []string{`"msg":"hello"`, `"msg":"careful"`}, wantErr: []string{`"msg":"oops"`}, notInErr: "hello"},
		{name: "text split", args: []string{"--logging-format=text", "--log-text-split-stream"}, wantOut: []string{"hello"}, wantErr: []string{"careful", "oops"}, notInOut: "careful"},
		{name: "json split buffered", args: []string{"--log-json-split-stream", "--log-json-info-buffer-size=1Mi"},
			wantOut: []string{`"msg":"hello"`}, wantErr: []string{`"msg":"oops"`}, infoBeforeStopAbsent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o options
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			o.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if err := o.applyLogFlags(); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			log, stop := newLogger(0, o.log, &out, &errOut)
			log.Sugar().Infow("hello", "n", 1)
			log.Warn("careful")
			log.Error("oops")
			if tt.infoBeforeStopAbsent && strings.Contains(out.String(), "hello") {
				t.Errorf("buffered info written before stop: %q", out.String())
			}
			stop()
			for _, c := range []struct {
				name, got, absent string
				want              []string
			}{{"stdout", out.String(), tt.notInOut, tt.wantOut}, {"stderr", errOut.String(), tt.notInErr, tt.wantErr}} {
				rest := c.got
				for _, w := range c.want {
					i := strings.Index(rest, w)
					if i < 0 {
						t.Errorf("%s lacks %q (in order):\n%s", c.name, w, c.got)
						break
					}
					rest = rest[i+len(w):]
				}
				if c.absent != "" && strings.Contains(c.got, c.absent) {
					t.Errorf("%s holds %q:\n%s", c.name, c.absent, c.got)
				}
				if len(c.want) == 0 && c.got != "" && c.absent == "" {
					t.Errorf("%s: %q, want nothing", c.name, c.got)
				}
			}
		})
	}
}

// TestConfigFileLoggingFormat: the file's logging.format applies unless
// --logging-format is given, as kube-proxy lays its flags over the file.
func TestConfigFileLoggingFormat(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{{[]string{"--config", file}, "text"}, {[]string{"--config", file, "--logging-format=json"}, "json"}} {
		o, err := parseFlags(t, tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		if o.log.format != tt.want {
			t.Errorf("%q: format %s, want %s", tt.args, o.log.format, tt.want)
		}
	}
}
