package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/proxier"
)

const (
	dashboardFile = "monitoring/dashboard.json"
	alertsFile    = "monitoring/alerts.yaml"
)

// exportedSeries returns every series name the daemon's registry exports:
// each family's name, and a histogram's _bucket, _sum and _count.
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	mt := proxier.NewMetrics()
	// A vector exports a family only once it has a child.
	mt.InvalidObjects.WithLabelValues("Service")
	mt.RulesetElements.WithLabelValues("ip")
	for _, v := range []interface {
		WithLabelValues(...string) prometheus.Observer
	}{mt.SyncDuration, mt.SyncFullDuration, mt.SyncPartialDuration, mt.NetworkProgramming, mt.ConntrackDuration} {
		v.WithLabelValues("IPv4")
	}
	mt.SyncLastTimestamp.WithLabelValues("IPv4")
	mt.SyncLastQueued.WithLabelValues("IPv4")
	mt.ConntrackDeleted.WithLabelValues("IPv4")
	families, err := mt.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+suffix] = true
			}
		}
	}
	return out
}

// dashboardExprs returns the PromQL of every panel target and of the
// template variables' queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: title %q, uid %q, %d panels; want all", dashboardFile, d.Title, d.UID, len(d.Panels))
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if inner, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			out = append(out, strings.TrimSpace(strings.SplitN(inner, ",", 2)[0]))
		}
	}
	return out
}

// alertRules returns the alerting rules of the rule file.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("parse %s: %v", alertsFile, err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// TestMonitoringUsesExportedMetrics checks that every series the dashboard
// and the alerts read is one the daemon exports, and the alerts cover what
// an operator must hear about.
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	exported := exportedSeries(t)
	check := func(where, expr string) {
		names, err := seriesNames(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s reads no metric: %s", where, expr)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("%s reads %s, which nftproxy does not export", where, n)
			}
		}
	}
	for i, e := range dashboardExprs(t) {
		check(fmt.Sprintf("dashboard query %d", i), e)
	}
	rules := alertRules(t)
	for _, r := range rules {
		check("alert "+r.Alert, r.Expr)
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("alert %s: needs a severity label and a summary", r.Alert)
		}
	}
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
	}
	for _, want := range []string{"NftproxySyncFailing", "NftproxyNoRecentSync", "NftproxySyncSlow",
		"NftproxyInvalidObjects", "NftproxyFrequentFullResyncs", "NftproxyConntrackCleanupFailing"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
}

// TestMonitoringPromtool has Prometheus's own promtool parse the alert
// rules, the dashboard's queries (as recording rules), and run the rules'
// unit tests (monitoring/alerts_test.yaml: the alerts fire on the series
// they are meant for).
func TestMonitoringPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("skipping: promtool not installed (Debian: apt-get install prometheus; make test installs it)")
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", alertsFile)
	run("test", "rules", "monitoring/alerts_test.yaml")

	// Grafana's interval and variables, as Grafana would fill them in.
	fill := strings.NewReplacer("$__rate_interval", "5m", `"$instance"`, `".*"`)
	type record struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var recs []record
	for i, e := range dashboardExprs(t) {
		recs = append(recs, record{Record: fmt.Sprintf("dashboard:query%d", i), Expr: fill.Replace(e)})
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": recs}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run("check", "rules", file)
}

// seriesNames returns the metric names a PromQL expression selects: the
// identifiers outside label matchers, ranges, strings and by/without/on/
// ignoring lists that are neither function calls nor keywords. Good enough
// for the queries here; promtool checks their full syntax.
func seriesNames(expr string) ([]string, error) {
	keywords := map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
		// aggregation operators, which may come before by (...)
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true}
	var out []string
	skipGrouping := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'':
			end := strings.IndexByte(expr[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unterminated string in %q", expr)
			}
			i += end + 2
		case c == '{' || c == '[' || (c == '(' && skipGrouping):
			closing := map[byte]byte{'{': '}', '[': ']', '(': ')'}[c]
			end := strings.IndexByte(expr[i:], closing)
			if end < 0 {
				return nil, fmt.Errorf("unbalanced %c in %q", c, expr)
			}
			i += end + 1
			skipGrouping = false
		case c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] == ':' || expr[j] >= 'a' && expr[j] <= 'z' ||
				expr[j] >= 'A' && expr[j] <= 'Z' || expr[j] >= '0' && expr[j] <= '9') {
				j++
			}
			word := expr[i:j]
			next := strings.TrimLeft(expr[j:], " \t\n")
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				skipGrouping = true
			case keywords[strings.ToLower(word)]:
			case strings.HasPrefix(next, "("): // a function call
			default:
				out = append(out, word)
			}
			i = j
		case c >= '0' && c <= '9' || c == '.':
			// A number or a duration (5m): digits, then letters.
			for i < len(expr) && (expr[i] >= '0' && expr[i] <= '9' || expr[i] == '.' || expr[i] >= 'a' && expr[i] <= 'z' || expr[i] == 'e') {
				i++
			}
		default:
			i++
		}
	}
	return out, nil
}

func TestSeriesNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`time() - a_b{instance=~"$x"} > 120`, []string{"a_b"}},
		{`histogram_quantile(0.99, sum by (instance, le) (rate(x_bucket[10m]))) > 5`, []string{"x_bucket"}},
		{`rate(a[5m]) > 0 and on(instance) rate(b[5m]) == 0`, []string{"a", "b"}},
		{`sum without (kind) (increase(c{kind="by"}[1h])) > 1e3`, []string{"c"}},
	}
	for _, tt := range tests {
		got, err := seriesNames(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("seriesNames(%q) = %q, %v; want %q", tt.expr, got, err, tt.want)
		}
	}
}
