package prom

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// Families are the metric families of one page, by name.
type Families map[string]*dto.MetricFamily

// Parse reads a page in Prometheus' text format.
func Parse(page []byte) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// Client reads pages of one metrics server inside a namespace. It keeps its
// connection between requests, so scraping every few milliseconds costs the
// server no new connection each time.
type Client struct {
	addr string // host:port inside the namespace
	http *http.Client
}

// NewClient reads the server at addr (127.0.0.1:10249, say) in ns; a request
// gives up after timeout.
func NewClient(ns *netns.NS, addr string, timeout time.Duration) *Client {
	return &Client{addr: addr, http: &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: ns.Dial}}}
}

// Get reads a page of the server, /metrics or /debug/pprof/heap, say.
func (c *Client) Get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr+path, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("read %s: %s", path, resp.Status)
	}
	return body, nil
}

// Scrape reads and parses /metrics; page is the text, for error messages.
func (c *Client) Scrape(ctx context.Context) (fams Families, page []byte, err error) {
	if page, err = c.Get(ctx, "/metrics"); err != nil {
		return nil, page, err
	}
	fams, err = Parse(page)
	return fams, page, err
}

// Scrape reads /metrics of the server at addr in ns once, within two seconds.
func Scrape(ctx context.Context, ns *netns.NS, addr string) (Families, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: ns.Dial}
	defer tr.CloseIdleConnections()
	c := &Client{addr: addr, http: &http.Client{Timeout: 2 * time.Second, Transport: tr}}
	fams, _, err := c.Scrape(ctx)
	return fams, err
}

// Series returns the series of mf whose labels have the given values (name,
// value, name, value…); nil when none has.
func Series(mf *dto.MetricFamily, labels ...string) *dto.Metric {
	for _, s := range mf.GetMetric() {
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range s.GetLabel() {
				found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
			}
			match = match && found
		}
		if match {
			return s
		}
	}
	return nil
}

// ipv4 reports whether a series counts as the IPv4 one: kube-proxy runs a
// proxier per family and labels its series with ip_family (IPv4, IPv6),
// nftproxy syncs both tables at once and labels each family's share the
// same way; a series without the label is the whole.
func ipv4(s *dto.Metric) bool {
	for _, l := range s.GetLabel() {
		if l.GetName() == "ip_family" {
			return strings.EqualFold(l.GetValue(), "ipv4")
		}
	}
	return true
}

// Histogram is a histogram's IPv4 series (or its unlabelled one): the sum in
// seconds, the count, and the cumulative buckets by increasing bound, +Inf
// last.
type Histogram struct {
	Sum     float64
	Count   int
	Buckets []Bucket
}

// Bucket counts the observations of at most LE seconds.
type Bucket struct {
	LE    float64
	Count float64
}

// Histogram returns the histogram name. A histogram vector has no series
// before its first observation, so an absent histogram reads as empty.
func (f Families) Histogram(name string) Histogram {
	var h Histogram
	for _, s := range f[name].GetMetric() {
		if !ipv4(s) || s.GetHistogram() == nil {
			continue
		}
		sh := s.GetHistogram()
		h.Sum += sh.GetSampleSum()
		h.Count += int(sh.GetSampleCount())
		for i, b := range sh.GetBucket() {
			if i < len(h.Buckets) {
				h.Buckets[i].Count += float64(b.GetCumulativeCount())
				continue
			}
			h.Buckets = append(h.Buckets, Bucket{LE: b.GetUpperBound(), Count: float64(b.GetCumulativeCount())})
		}
	}
	return h
}

// Sub returns what was observed between prev and h (the same histogram read
// twice); the buckets are h's.
func (h Histogram) Sub(prev Histogram) Histogram {
	return Histogram{Sum: h.Sum - prev.Sum, Count: h.Count - prev.Count, Buckets: h.Buckets}
}

// Quantile returns the upper bound of the bucket holding the q-quantile of
// what was observed between before and after (the same histogram read
// twice); +Inf when it lies beyond the last bound, 0 when nothing was
// observed.
func Quantile(before, after Histogram, q float64) float64 {
	if len(after.Buckets) == 0 {
		return 0
	}
	delta := func(i int) float64 {
		if i < len(before.Buckets) {
			return after.Buckets[i].Count - before.Buckets[i].Count
		}
		return after.Buckets[i].Count
	}
	total := delta(len(after.Buckets) - 1)
	if total == 0 {
		return 0
	}
	for i := range after.Buckets {
		if delta(i) >= q*total {
			return after.Buckets[i].LE
		}
	}
	return after.Buckets[len(after.Buckets)-1].LE
}

// Gauge returns an unlabelled gauge (go_goroutines, say), or a sample of a
// page that gives it no type; ok is false when the page has none.
func (f Families) Gauge(name string) (v float64, ok bool) {
	ms := f[name].GetMetric()
	switch {
	case len(ms) == 0:
		return 0, false
	case ms[0].GetGauge() != nil:
		return ms[0].GetGauge().GetValue(), true
	case ms[0].GetUntyped() != nil:
		return ms[0].GetUntyped().GetValue(), true
	}
	return 0, false
}
