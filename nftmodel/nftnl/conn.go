package nftnl

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// Conn is a connection to one network namespace's nftables: a google/nftables
// connection, through which the applier reads the kernel's state, and a
// netfilter socket of its own for batches, opened in the same namespace at
// the first batch and kept (closing a socket waits for the kernel to finish
// freeing what the last batch deleted; see sendBatch).
//
// The library's connection stays inside: callers get what nftproxy needs of
// the kernel, as the functions of this package, and nothing else.
type Conn struct {
	// lib is reached through the methods below, which hold libMu.
	lib   *nftables.Conn
	libMu sync.Mutex
	// open opens a batch socket: in the connection's namespace, or in
	// tests one that hands the batches to a test dialer.
	open func() (BatchSocket, error)
	// SendTimeout bounds the sending of one batch (0: DefaultSendTimeout).
	SendTimeout time.Duration

	mu      sync.Mutex
	batches BatchSocket
	wrap    func(BatchSocket) BatchSocket
	ports   []uint32 // port IDs of the last batch sockets, the newest last
}

// DefaultSendTimeout bounds the sending of a batch when Conn.SendTimeout is
// not set; the kernel handles even a 50,000-service batch in under a second.
const DefaultSendTimeout = 30 * time.Second

func (c *Conn) sendTimeout() time.Duration {
	if c.SendTimeout > 0 {
		return c.SendTimeout
	}
	return DefaultSendTimeout
}

// WrapBatches makes every batch socket the connection opens from now on go
// through wrap: tests inject faults that way. The socket already open is
// closed.
func (c *Conn) WrapBatches(wrap func(BatchSocket) BatchSocket) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.batches != nil {
		_ = c.batches.Close()
		c.batches = nil
	}
	c.wrap = wrap
}

// OwnPort tells whether port is the netlink port ID of one of the
// connection's recent batch sockets: the kernel's notifications of our own
// commits carry it.
func (c *Conn) OwnPort(port uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.ports, port)
}

// Dial opens a lasting connection in the network namespace netnsFd (0 for
// the caller's own); close it with Close.
func Dial(netnsFd int) (*Conn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if netnsFd != 0 {
		opts = append(opts, nftables.WithNetNSFd(netnsFd))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("dial nftables: %w", err)
	}
	return &Conn{lib: c, open: func() (BatchSocket, error) { return dialNetfilterSocket(netnsFd) }}, nil
}

// Close closes the batch socket and the library's lasting socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	sock := c.batches
	c.batches = nil
	c.mu.Unlock()
	var err error
	if sock != nil {
		err = sock.Close()
	}
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return errors.Join(err, c.lib.CloseLasting())
}

// The library's requests, one at a time. Its lasting socket is shared by
// the sync loop and the /metrics scrape (rule counters): two requests in
// flight at once read each other's replies, which fails one ("mismatched
// sequence in netlink reply") and leaves the other waiting for a reply that
// was taken, for good (TestConcurrentReadsAndApplies).

func (c *Conn) getGen() (*nftables.Gen, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.GetGen()
}

func (c *Conn) listTable(name string, f nftables.TableFamily) (*nftables.Table, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.ListTableOfFamily(name, f)
}

func (c *Conn) getSets(t *nftables.Table) ([]*nftables.Set, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.GetSets(t)
}

func (c *Conn) listChains(f nftables.TableFamily) ([]*nftables.Chain, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.ListChainsOfTableFamily(f)
}

func (c *Conn) getRules(t *nftables.Table, ch *nftables.Chain) ([]*nftables.Rule, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.GetRules(t, ch)
}

func (c *Conn) getSetByName(t *nftables.Table, name string) (*nftables.Set, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.GetSetByName(t, name)
}

func (c *Conn) getSetElements(s *nftables.Set) ([]nftables.SetElement, error) {
	c.libMu.Lock()
	defer c.libMu.Unlock()
	return c.lib.GetSetElements(s)
}

// TableChain names a chain and its table.
type TableChain struct{ Table, Chain string }

// Chains lists the chains of every table of the family, whoever wrote them
// (iptables-nft, for one).
func (c *Conn) Chains(f nftmodel.Family) ([]TableChain, error) {
	cs, err := c.listChains(libFamily(f))
	if err != nil {
		return nil, fmt.Errorf("list %s chains: %w", f, err)
	}
	out := make([]TableChain, 0, len(cs))
	for _, lc := range cs {
		if lc.Table != nil {
			out = append(out, TableChain{Table: lc.Table.Name, Chain: lc.Name})
		}
	}
	return out, nil
}

// Kernel is the sync loop's kernel (proxier.Kernel): the applier on one
// connection, lasting in the daemon.
type Kernel struct{ Conn *Conn }

func (k Kernel) Apply(rs *nftmodel.Ruleset) (nftmodel.Stats, error) { return Apply(k.Conn, rs) }

func (k Kernel) ApplyChanges(f nftmodel.Family, table string, c *nftmodel.Changes) (nftmodel.Stats, error) {
	return ApplyChanges(k.Conn, f, table, c)
}

func (k Kernel) Generation() (uint32, error) { return Generation(k.Conn) }

// PruneElements makes Kernel a proxier.AffinityPruner.
func (k Kernel) PruneElements(f nftmodel.Family, table string, set *nftmodel.Set, keep func(nftmodel.Element) bool) (int, error) {
	return PruneElements(k.Conn, f, table, set, keep)
}
