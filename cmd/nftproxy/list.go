package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/nftproxy/nftproxy/nftmodel"
	"github.com/nftproxy/nftproxy/nftmodel/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
)

// list prints nftproxy's tables in this network namespace as the kernel holds
// them: read back over netlink and printed by the renderer, the text `nft
// list table` prints, without the nft binary. family is "ip", "ip6" or ""
// for both; a family without a table is left out, and none at all is an error.
func list(w io.Writer, family string) error {
	var families []nftmodel.Family
	switch family {
	case "":
		families = []nftmodel.Family{nftmodel.IPv4, nftmodel.IPv6}
	case "ip":
		families = []nftmodel.Family{nftmodel.IPv4}
	case "ip6":
		families = []nftmodel.Family{nftmodel.IPv6}
	default:
		return fmt.Errorf("--family %q: want ip or ip6", family)
	}
	conn, err := nftnl.Dial(0)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	found := false
	for _, f := range families {
		rs, err := nftnl.Read(conn, f, proxier.TableName)
		if errors.Is(err, nftnl.ErrNoTable) {
			continue
		}
		if err != nil {
			return err
		}
		found = true
		if _, err := fmt.Fprint(w, nftmodel.Render(rs)); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("no table %s in this network namespace", proxier.TableName)
	}
	return nil
}
