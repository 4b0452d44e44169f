package mqttclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
)

// Options configures one upstream connection.
type Options struct {
	Address        string        // host:port
	TLS            *tls.Config   // nil: plain TCP; an empty ServerName is taken from Address
	ClientID       string        // empty: the server assigns one (MQTT 5), see Info.AssignedClientID
	Username       string        // sent when not empty
	Password       []byte        // sent when not empty
	Protocol       byte          // 5, 4 (3.1.1), or 0: try 5 and fall back to 4 when the server refuses 5
	KeepAlive      time.Duration // sent in CONNECT (rounded up to seconds); a PINGREQ goes when nothing was sent for this long; 0: none
	CleanStart     bool          // discard any session the server holds for ClientID
	SessionExpiry  time.Duration // MQTT 5 session expiry; on 3.1.1 a non-zero value means clean session false
	ConnectTimeout time.Duration // dial + TLS + CONNACK, over both attempts of a fallback; 0: 30 s
	AckTimeout     time.Duration // an acknowledgement or PINGRESP later than this, or a write blocked this long, ends the connection with ErrHalfOpen; 0: 30 s
	MaxInflight    int           // our own cap on QoS 1/2 publishes in flight; 0: none; the window is min(MaxInflight, server's Receive Maximum)
	Will           *Will         // optional
	// OnMessage is called on the reader goroutine, one message at a time;
	// the PUBACK (QoS 1) or PUBREC (QoS 2) goes after it returns, so a slow
	// handler is back-pressure. It may call Publish, but not Subscribe,
	// Unsubscribe or Close, which wait for the reader. nil: messages are
	// acknowledged and dropped.
	OnMessage func(m *Incoming)
	// Received carries the inbound QoS 2 state of the session from one
	// connection to the next; nil: the client keeps it for this
	// connection only. See Received.
	Received *Received
	// OnPubrec, when set, holds back the PUBREL that answers a PUBREC of
	// one of our QoS 2 publishes: the client calls it with the packet
	// identifier, on the reader goroutine (it must not block), and sends
	// the PUBREL when ReleaseHeld is called, so that the caller can first
	// record that the message was received. nil: PUBREL goes at once.
	OnPubrec func(pid uint16)
}

// Will is the message the server publishes when the connection ends
// without a normal DISCONNECT.
type Will struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
}

// Defaults for zero durations in Options.
const (
	defaultConnectTimeout = 30 * time.Second
	defaultAckTimeout     = 30 * time.Second
)

// check reports every problem with the options at once.
func (o *Options) check() error {
	var errs []error
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		errs = append(errs, fmt.Errorf("option Address %q is not host:port: %w", o.Address, err))
	}
	if o.Protocol != 0 && o.Protocol != 4 && o.Protocol != 5 {
		errs = append(errs, fmt.Errorf("option Protocol %d: want 5, 4 (3.1.1) or 0 (5, falling back to 4)", o.Protocol))
	}
	if o.KeepAlive < 0 || o.KeepAlive > mqttwire.MaxKeepAlive {
		errs = append(errs, fmt.Errorf("option KeepAlive %v: want 0 to %ds", o.KeepAlive, mqttwire.MaxKeepAlive/time.Second))
	}
	if o.SessionExpiry < 0 || o.SessionExpiry > mqttwire.MaxSessionExpiry {
		errs = append(errs, fmt.Errorf("option SessionExpiry %v: want 0 to %ds", o.SessionExpiry, mqttwire.MaxSessionExpiry/time.Second))
	}
	if o.MaxInflight < 0 {
		errs = append(errs, fmt.Errorf("option MaxInflight %d: want 0 (no cap of ours) or more", o.MaxInflight))
	}
	if len(o.ClientID) > mqttwire.MaxString || len(o.Username) > mqttwire.MaxString || len(o.Password) > mqttwire.MaxString {
		errs = append(errs, fmt.Errorf("options ClientID, Username and Password must each be at most %d bytes", mqttwire.MaxString))
	}
	if w := o.Will; w != nil {
		if err := matcher.ValidateTopic(w.Topic); err != nil {
			errs = append(errs, fmt.Errorf("option Will.Topic: %w", err))
		}
		if w.QoS > 2 {
			errs = append(errs, fmt.Errorf("option Will.QoS %d: want 0, 1 or 2", w.QoS))
		}
		if len(w.Payload) > mqttwire.MaxString {
			errs = append(errs, fmt.Errorf("option Will.Payload of %d bytes: at most %d", len(w.Payload), mqttwire.MaxString))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("bridge: %w", errors.Join(errs...))
}
