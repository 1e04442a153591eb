package proxier

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	m "github.com/nftproxy/nftproxy/nftmodel"
)

// invalidDrops is nftproxy_ct_state_invalid_dropped_packets_total: the
// packets the forward chain's rule dropped because conntrack calls them
// invalid (kube-proxy's iptables mode counts the same in
// kubeproxy_iptables_ct_state_invalid_dropped_packets_total; its nftables
// mode has no such rule). The rule's counter is read over netlink at scrape
// time; a full sync writes the rule anew, so what it had counted is kept
// in gone.
type invalidDrops struct {
	kernel CounterReader
	cfgs   []Config // those with DropInvalid
	log    *zap.Logger
	desc   *prometheus.Desc

	mu   sync.Mutex
	gone map[m.Family]uint64
}

func newInvalidDrops(k CounterReader, cfgs []Config, log *zap.Logger) *invalidDrops {
	d := &invalidDrops{kernel: k, log: log, gone: map[m.Family]uint64{},
		desc: prometheus.NewDesc("nftproxy_ct_state_invalid_dropped_packets_total",
			"Packets dropped because conntrack calls them invalid (forwarded ones, unless nf_conntrack_tcp_be_liberal is set), as kube-proxy's iptables mode counts in kubeproxy_iptables_ct_state_invalid_dropped_packets_total.",
			[]string{"ip_family"}, nil)}
	for _, c := range cfgs {
		if c.DropInvalid {
			d.cfgs = append(d.cfgs, c)
		}
	}
	return d
}

// beforeRewrite reads what the family's rule counted before a full apply
// replaces it; nothing when there is no such rule.
func (d *invalidDrops) beforeRewrite(cfg Config) uint64 {
	if d == nil || !cfg.DropInvalid {
		return 0
	}
	n, err := d.kernel.CounterPackets(cfg.Family, TableName, chainFilterForward)
	if err != nil {
		d.log.Debug("Reading the invalid-drop counter failed", zap.Stringer("family", cfg.Family), zap.Error(err))
		return 0
	}
	return n
}

// rewritten keeps the counts of a rule a full apply replaced.
func (d *invalidDrops) rewritten(f m.Family, counted uint64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gone[f] += counted
}

func (d *invalidDrops) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *invalidDrops) Collect(ch chan<- prometheus.Metric) {
	for _, c := range d.cfgs {
		n, err := d.kernel.CounterPackets(c.Family, TableName, chainFilterForward)
		if err != nil {
			d.log.Warn("Reading the invalid-drop counter failed", zap.Stringer("family", c.Family), zap.Error(err))
			continue
		}
		d.mu.Lock()
		n += d.gone[c.Family]
		d.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(n), familyLabel(c.Family))
	}
}
