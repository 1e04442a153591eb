package nftmodel

// What the kernel side (package nftnl) hands back to the sync loop, as plain
// values: the sync loop uses them without importing anything that talks to
// the kernel. The netfilter numbers below are the kernel's ABI; nftnl's tests
// check them against golang.org/x/sys/unix.

// Stats counts what one batch carried.
type Stats struct {
	Messages int // netlink messages in the batch, batch begin and end included
	Elements int // set elements added or deleted (anonymous maps' included)
	Rules    int // rules added
	Chains   int // chains added, flushed one by one or deleted
	Sets     int // named sets added, flushed or deleted
	// Kept counts the named sets a full apply kept with their elements
	// (dynamic sets: the packet path's live state). With none kept, every
	// element of the table came in this batch.
	Kept int
}

// Event is one nftables notification: an object a commit in the namespace
// added or deleted, or the commit's new generation.
type Event struct {
	Type   uint16 // NFT_MSG_NEWTABLE … (unix.NFT_MSG_*), NFT_MSG_NEWGEN ends a commit
	Family uint8  // the table's netfilter family (unix.NFPROTO_*)
	Table  string // the table the object is in; empty for a generation
	Port   uint32 // netlink port ID of the socket whose batch committed it
	// Lost: the kernel dropped notifications, as the socket's buffer
	// overflowed; which and whose is unknown.
	Lost bool
}

// Netfilter's family numbers (NFPROTO_IPV4, NFPROTO_IPV6).
const (
	nfprotoIPv4 = 2
	nfprotoIPv6 = 10
)

// FamilyOf returns the model's family of a netfilter family number.
func FamilyOf(nfproto uint8) (Family, bool) {
	switch nfproto {
	case nfprotoIPv4:
		return IPv4, true
	case nfprotoIPv6:
		return IPv6, true
	}
	return 0, false
}

// EventNewGen is the Type of the event ending each commit (NFT_MSG_NEWGEN).
const EventNewGen = 15
