package e2e

import (
	dto "github.com/prometheus/client_model/go"
)

// seriesWith returns the series of mf whose labels have the given values
// (name, value, name, value…); nil when none has.
func seriesWith(mf *dto.MetricFamily, labels ...string) *dto.Metric {
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
