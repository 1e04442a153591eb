package nftnl

import (
	"testing"

	"github.com/nftproxy/nftproxy/nftmodel"
)

// FuzzReplies feeds any bytes to the parsers of what the kernel sends back:
// the batch's replies (splitMessages, firstRefusal) and the nftables
// notifications (ParseEvent). They must not panic, and what they report
// must be consistent: a refusal is an error of the batch, an event names a
// table unless it is a generation.
func FuzzReplies(f *testing.F) {
	// The seeds are in testdata/fuzz/FuzzReplies.
	f.Fuzz(func(t *testing.T, data []byte, seq uint32, n uint16) {
		msgs, err := splitMessages(data)
		if err != nil {
			return
		}
		if r := firstRefusal(msgs, seq, int(n)); r != nil {
			if r.seq-seq >= uint32(n) || r.errno == 0 {
				t.Errorf("refusal %+v outside the batch of %d from %d, or no error", r, n, seq)
			}
		}
		for _, m := range msgs {
			e, ok := ParseEvent(m)
			if !ok {
				continue
			}
			if e.Type > 0xff || (e.Type != nftmodel.EventNewGen && e.Table == "") || e.Lost {
				t.Errorf("event %+v from %v", e, m)
			}
		}
	})
}
