package features_test

import (
	"errors"
	"fmt"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/features"
)

// Probing the caller's network namespace for what an IPv4 ruleset and the
// conntrack cleanup need (root only, so this example is compiled, not run).
func ExampleProber() {
	p := features.NewProber(0, nftmodel.IPv4)
	err := p.Check(append(features.Ruleset(), features.ConntrackNetlink)...)
	switch {
	case errors.Is(err, features.ErrNotSupported):
		fmt.Println("refusing to start:", err) // names the feature and its minimum kernel
	case err != nil:
		fmt.Println("cannot tell:", err) // e.g. no CAP_NET_ADMIN
	}
}
