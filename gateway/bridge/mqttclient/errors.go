package mqttclient

import (
	"errors"
	"fmt"
	"io"
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
	s := fmt.Sprintf("server disconnected: %s (0x%02X)", reasonName(e.Code), e.Code)
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

// protocolError is a server packet that breaks the protocol; on MQTT 5 the
// client says so with a DISCONNECT of that code before closing.
type protocolError struct {
	code byte
	msg  string
}

func (e *protocolError) Error() string {
	return fmt.Sprintf("protocol error from the server: %s (reason 0x%02X)", e.msg, e.code)
}

func protoErr(code byte, format string, args ...any) error {
	return &protocolError{code: code, msg: fmt.Sprintf(format, args...)}
}

// connackMeaning says what a CONNACK code means in its version.
func connackMeaning(version, code byte) string {
	if version == 4 {
		switch code {
		case 1:
			return "unacceptable protocol version"
		case 2:
			return "client identifier rejected"
		case 3:
			return "server unavailable"
		case 4:
			return "bad user name or password"
		case 5:
			return "not authorized"
		}
		return "unknown return code"
	}
	return reasonName(code)
}

// reasonNames are the MQTT 5 reason codes a CONNACK, DISCONNECT, PUBACK,
// PUBREC or UNSUBACK carries (§2.4).
var reasonNames = map[byte]string{
	0x00: "success",
	0x04: "disconnect with will message",
	0x10: "no matching subscribers",
	0x11: "no subscription existed",
	0x80: "unspecified error",
	0x81: "malformed packet",
	0x82: "protocol error",
	0x83: "implementation specific error",
	0x84: "unsupported protocol version",
	0x85: "client identifier not valid",
	0x86: "bad user name or password",
	0x87: "not authorized",
	0x88: "server unavailable",
	0x89: "server busy",
	0x8A: "banned",
	0x8B: "server shutting down",
	0x8C: "bad authentication method",
	0x8D: "keep alive timeout",
	0x8E: "session taken over",
	0x8F: "topic filter invalid",
	0x90: "topic name invalid",
	0x91: "packet identifier in use",
	0x92: "packet identifier not found",
	0x93: "receive maximum exceeded",
	0x94: "topic alias invalid",
	0x95: "packet too large",
	0x96: "message rate too high",
	0x97: "quota exceeded",
	0x98: "administrative action",
	0x99: "payload format invalid",
	0x9A: "retain not supported",
	0x9B: "QoS not supported",
	0x9C: "use another server",
	0x9D: "server moved",
	0x9E: "shared subscriptions not supported",
	0x9F: "connection rate exceeded",
	0xA0: "maximum connect time",
	0xA1: "subscription identifiers not supported",
	0xA2: "wildcard subscriptions not supported",
}

func reasonName(code byte) string {
	if s, ok := reasonNames[code]; ok {
		return s
	}
	return "unknown reason code"
}
