package mqttclient

import (
	"errors"
	"fmt"
	"io"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

var (
	// ErrWindowFull is Publish or Release refusing a QoS 1/2 message while
	// Window() messages are in flight; wait for a done callback and retry.
	ErrWindowFull = errors.New("bridge: in-flight window full")
	// ErrHalfOpen ends a connection whose server stopped answering: an
	// acknowledgement or PINGRESP overdue by AckTimeout, or a write
	// blocked that long.
	ErrHalfOpen = errors.New("bridge: upstream link half-open")
	// ErrRefused is a CONNACK that refused the connection; the error is a
	// *RefusedError with the code.
	ErrRefused = errors.New("bridge: connection refused")
	// ErrClosed is the error of calls and callbacks after Close.
	ErrClosed = errors.New("bridge: client closed")
	// ErrTooLarge is Publish refusing a message above the server's
	// Maximum Packet Size [MQTT-3.2.2-15]; the connection stays up.
	ErrTooLarge = errors.New("bridge: packet larger than the server's maximum packet size")
	// ErrReleasePending marks the done error of a QoS 2 message that had
	// its PUBREC when the connection ended: after reconnecting with a
	// session present, finish it with Release, not a resend [MQTT-4.4.0-1].
	ErrReleasePending = errors.New("bridge: PUBREC received, PUBREL pending")
)

// RefusedError is a CONNACK that refused the connection. It matches
// ErrRefused.
type RefusedError struct {
	Version         byte   // the protocol version of the CONNACK
	Code            byte   // MQTT 5 reason code, or 3.1.1 return code
	Reason          string // the server's reason string, if any
	ServerReference string // where the server sends us instead, if it says
}

// Error names the code and what it means.
func (e *RefusedError) Error() string {
	s := fmt.Sprintf("server refused the connection: %s (0x%02X)", connackMeaning(e.Version, e.Code), e.Code)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.ServerReference != "" {
		s += "; server reference " + e.ServerReference
	}
	return s
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// DisconnectError is a server DISCONNECT (MQTT 5) that ended the
// connection.
type DisconnectError struct {
	Code            byte
	Reason          string // the server's reason string, if any
	ServerReference string
}

// Error names the reason code and what it means.
func (e *DisconnectError) Error() string {
	s := fmt.Sprintf("server disconnected: %s (0x%02X)", mqttwire.ReasonName(e.Code), e.Code)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.ServerReference != "" {
		s += "; server reference " + e.ServerReference
	}
	return s
}

// lostErr wraps a read or write error of a connection that ended without
// a DISCONNECT.
func (c *Client) lostErr(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("bridge: %s closed the connection: %w", c.desc, err)
	}
	return fmt.Errorf("bridge: connection to %s lost: %w", c.desc, err)
}

// connackMeaning says what a CONNACK code means in its version.
func connackMeaning(version, code byte) string {
	if version == 4 {
		switch code {
		case packets.Err3UnsupportedProtocolVersion.Code:
			return "unacceptable protocol version"
		case packets.Err3ClientIdentifierNotValid.Code:
			return "client identifier rejected"
		case packets.Err3ServerUnavailable.Code:
			return "server unavailable"
		case packets.ErrMalformedUsernameOrPassword.Code:
			return "bad user name or password"
		case packets.Err3NotAuthorized.Code:
			return "not authorized"
		}
		return "unknown return code"
	}
	return mqttwire.ReasonName(code)
}
