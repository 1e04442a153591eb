package features

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// ErrNotSupported matches every *UnsupportedError.
var ErrNotSupported = errors.New("not supported by this kernel")

// errMissing is what a probe returns when the kernel accepted its request
// but did not do what the feature does.
var errMissing = errors.New("kernel accepted the request but did not act on it")

// UnsupportedError says that the kernel lacks a feature, and since which
// Linux release kernels have it.
type UnsupportedError struct {
	Feature   string
	MinKernel string
	Err       error // what the kernel answered
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("kernel lacks %s (needs Linux %s or later): %v", e.Feature, e.MinKernel, e.Err)
}

// Is makes errors.Is(err, ErrNotSupported) true.
func (e *UnsupportedError) Is(target error) bool { return target == ErrNotSupported }

func (e *UnsupportedError) Unwrap() error { return e.Err }

// Feature is one kernel feature and its probe.
type Feature struct {
	// Name says what nftproxy uses, in nft's words where nft has them.
	Name string
	// MinKernel is the first Linux release that has the feature.
	MinKernel string
	// program describes the feature's objects in a probe table (nftables
	// features); run probes anything else.
	program func(b *build)
	run     func(p *Prober) error
}

func (f *Feature) String() string { return f.Name }

// Prober probes the kernel from one network namespace, each feature at most
// once: a result, supported or not, is kept for the Prober's life.
type Prober struct {
	netns    int
	families []nftmodel.Family

	mu      sync.Mutex
	results map[*Feature]error
	tables  int  // probe tables made so far, for unique names
	noOwner bool // the kernel refused owned tables (before Linux 5.12)
}

// NewProber returns a Prober for the network namespace whose descriptor is
// netns (0: the caller's), probing nftables features in tables of the given
// families: the families nftproxy will program.
func NewProber(netns int, families ...nftmodel.Family) *Prober {
	return &Prober{netns: netns, families: families, results: map[*Feature]error{}}
}

// Probe returns nil when the kernel has f, an *UnsupportedError when it
// lacks it, or another error when the probe could not tell (no permission,
// for instance). The first call probes; later calls return the same result.
func (p *Prober) Probe(f *Feature) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err, ok := p.results[f]; ok {
		return err
	}
	var err error
	if f.run != nil {
		err = f.run(p)
	} else {
		err = p.programTable(p.tableName(), f.program, false)
	}
	err = classify(f, err)
	p.results[f] = err
	return err
}

// Check probes fs in order and returns the first error.
func (p *Prober) Check(fs ...*Feature) error {
	for _, f := range fs {
		if err := p.Probe(f); err != nil {
			return err
		}
	}
	return nil
}

// classify turns the kernel's refusal into an *UnsupportedError. The
// answers of a kernel that lacks an expression, chain type, set feature or
// attribute size are these; others (EPERM, ENOBUFS, …) say nothing about
// the feature and are returned wrapped.
func classify(f *Feature, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errMissing) {
		return &UnsupportedError{Feature: f.Name, MinKernel: f.MinKernel, Err: err}
	}
	for _, errno := range []unix.Errno{unix.ENOENT, unix.EOPNOTSUPP, unix.EAFNOSUPPORT, unix.EPROTONOSUPPORT,
		unix.EINVAL, unix.ERANGE, unix.EOVERFLOW, unix.E2BIG} {
		if errors.Is(err, errno) {
			return &UnsupportedError{Feature: f.Name, MinKernel: f.MinKernel, Err: err}
		}
	}
	return fmt.Errorf("probe kernel for %s: %w", f.Name, err)
}
