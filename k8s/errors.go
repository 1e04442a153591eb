package k8s

import (
	"errors"
	"fmt"
)

// Kinds of the objects an ObjectError names.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
	KindNode          = "Node"
)

// Reasons an object or a part of it is skipped; match them with errors.Is.
var (
	ErrInvalidIP       = errors.New("invalid IP address")
	ErrInvalidPrefix   = errors.New("invalid CIDR")
	ErrPortRange       = errors.New("port out of range")
	ErrUnknownProtocol = errors.New("unknown protocol")
	ErrMissingField    = errors.New("missing required field")
	ErrNameTooLong     = errors.New("name too long")
	ErrInvalidName     = errors.New("invalid name")
	ErrInvalidValue    = errors.New("invalid value")
	ErrDuplicate       = errors.New("duplicate")
	ErrConflict        = errors.New("conflicts with another service")
)

// ObjectError says what is wrong with an object the tracker skipped, in whole
// or in part. Skipped names the part left out: "service", "port http/TCP",
// "endpoint 10.0.0.1", "slice", "node address".
type ObjectError struct {
	Kind      string
	Namespace string
	Name      string
	Field     string // path of the offending field, e.g. spec.ports[1].port
	Skipped   string
	Err       error
}

func (e *ObjectError) Error() string {
	obj := e.Name
	if e.Namespace != "" {
		obj = e.Namespace + "/" + e.Name
	}
	msg := fmt.Sprintf("%s %s: ", e.Kind, obj)
	if e.Field != "" {
		msg += e.Field + ": "
	}
	msg += e.Err.Error()
	if e.Skipped != "" {
		msg += " (" + e.Skipped + " skipped)"
	}
	return msg
}

func (e *ObjectError) Unwrap() error { return e.Err }

// reasonf wraps a sentinel reason with details: reasonf(ErrPortRange, "got %d", 0).
func reasonf(reason error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", reason, fmt.Sprintf(format, args...))
}
