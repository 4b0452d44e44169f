package bridge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// A link is productive once it delivered something: an acknowledgement of
// one of our messages came (PUBACK, or PUBCOMP), or it held for a keep
// alive interval without an error. The backoff starts again only then. A
// link the server closes right after CONNACK, or on the first message it
// gets, delivers nothing, and counts as a failed attempt like a refused
// dial, so that a server that accepts and drops every link is not
// redialled at once forever.
//
// Why a keep alive interval: by then the watchdog has had to ask the
// server for a PINGRESP on an idle link, so a link that lasts that long
// is one the server keeps, whether or not there was anything to send; and
// a server that ends links after that long is redialled at most once per
// keep alive (60 s by default, 1 s at the least the configuration
// allows), which is no storm. A link that lasts reconnect_max is healthy
// too, when that is shorter: its redials are no closer than the longest
// backoff would space them, and an idle gateway on a keep alive of hours
// is not held off its in-routes for a whole backoff when the server drops
// it after minutes. A SUBACK or a PINGRESP alone is not delivery: a server
// can answer both and still close the link on the first PUBLISH.
//
// The log says why links fail once per change, not once per attempt: the
// first failure, and each one whose kind differs from the one logged last,
// at warning level; the same failure again at debug level. A connection
// is logged when the link was healthy before, or when the failures were of
// dialling (the upstream is back); the end of a run of failures is logged
// with the attempts it took when the link that ends it was not.

// noteConnected logs a new link as the run of failures it may end asks.
func (b *Bridge) noteConnected(lk *linkRun) {
	if b.loop.failing == 0 || strings.HasPrefix(b.loop.trouble, "dial") {
		lk.announced = true
		b.loop.trouble = ""
		args := []any{"address", b.rt.Load().cfg.Address, "protocol", versionName(lk.c.Info().Version)}
		if b.loop.failing > 0 {
			args = append(args, "attempts", b.loop.failing+1)
		}
		b.log.Info("upstream connected", args...)
		return
	}
	b.log.Debug("upstream connected again", "attempts", b.loop.failing+1)
}

// noteProductive marks lk as having delivered something: the backoff
// starts again, and a run of failures it ends is logged as over.
func (b *Bridge) noteProductive(lk *linkRun) {
	if lk.productive {
		return
	}
	lk.productive = true
	if b.loop.failing > 0 && !lk.announced {
		b.log.Info("upstream link recovered", "attempts", b.loop.failing+1,
			"failing_for", time.Since(b.loop.failingSince).Round(time.Second))
	}
	b.loop.failing, b.loop.trouble = 0, ""
	b.shared.mu.Lock()
	b.shared.failing = 0
	b.shared.mu.Unlock()
}

// checkProductive marks lk productive when an acknowledgement came on it,
// or it has held for a keep alive interval (or reconnect_max).
func (b *Bridge) checkProductive(lk *linkRun) {
	if lk.productive {
		return
	}
	cfg := &b.rt.Load().cfg
	if b.progress.Load() != lk.acks || time.Since(lk.start) >= min(cfg.KeepAlive, cfg.ReconnectMax) {
		b.noteProductive(lk)
	}
}

// noteLost logs the end of a productive link: the upstream was fine until
// now.
func (b *Bridge) noteLost(err error) {
	b.loop.trouble = "link: " + failureKind(err)
	b.log.Warn("upstream link down", "address", b.rt.Load().cfg.Address, "err", err)
}

// noteFailed counts a failed dial (phase "dial") or a link that delivered
// nothing ("link"): the backoff grows, and the log says why when the
// failure is not the one it said last.
func (b *Bridge) noteFailed(phase string, err error) {
	if b.loop.failing == 0 {
		b.loop.failingSince = time.Now()
	}
	b.loop.failing++
	b.shared.mu.Lock()
	b.shared.failing = b.loop.failing
	b.shared.mu.Unlock()
	kind := phase + ": " + failureKind(err)
	if kind == b.loop.trouble {
		b.log.Debug("upstream link failed again", "err", err, "attempts", b.loop.failing)
		return
	}
	b.loop.trouble = kind
	msg := "cannot connect to the upstream; retrying with backoff, and saying so again only when the reason changes"
	if phase == "link" {
		msg = "upstream link ended before it delivered anything; retrying with backoff, and saying so again only when the reason changes"
	}
	b.log.Warn(msg, "address", b.rt.Load().cfg.Address, "err", err, "attempts", b.loop.failing)
}

// failureKind names what kind of failure err is, leaving out what changes
// from one attempt to the next (ports, packet identifiers), so that a
// repeat is recognised.
func failureKind(err error) string {
	var re *mqttclient.RefusedError
	var de *mqttclient.DisconnectError
	var pe *mqttwire.Error
	var dns *net.DNSError
	switch {
	case err == nil:
		return "closed by us"
	case errors.As(err, &re):
		return fmt.Sprintf("refused %d/0x%02X", re.Version, re.Code)
	case errors.As(err, &de):
		return fmt.Sprintf("disconnect 0x%02X", de.Code)
	case errors.As(err, &pe):
		return fmt.Sprintf("protocol error 0x%02X", pe.Code)
	case errors.Is(err, mqttclient.ErrHalfOpen):
		return "half-open"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		// One close, seen as an end of file, a reset or a broken pipe
		// as the link's last read or write happens to meet it.
		return "closed by the server"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.As(err, &dns):
		return "name lookup"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return "timeout"
	}
	return err.Error()
}

// notTheMessage are the DISCONNECT reasons by which a server ends a link
// for what it is doing or for the connection as a whole, never for the
// message it was reading: they put no message under suspicion.
var notTheMessage = map[byte]bool{
	0x00:                                                true, // normal disconnection
	packets.ErrServerBusy.Code:                          true,
	packets.ErrBanned.Code:                              true,
	packets.ErrServerShuttingDown.Code:                  true,
	packets.ErrKeepAliveTimeout.Code:                    true,
	packets.ErrSessionTakenOver.Code:                    true,
	packets.ErrTopicFilterInvalid.Code:                  true, // a SUBSCRIBE's
	packets.ErrReceiveMaximum.Code:                      true,
	packets.ErrMessageRateTooHigh.Code:                  true,
	packets.ErrQuotaExceeded.Code:                       true,
	packets.ErrAdministrativeAction.Code:                true,
	packets.ErrUseAnotherServer.Code:                    true,
	packets.ErrServerMoved.Code:                         true,
	packets.ErrSharedSubscriptionsNotSupported.Code:     true,
	packets.ErrConnectionRateExceeded.Code:              true,
	packets.ErrMaxConnectTime.Code:                      true,
	packets.ErrSubscriptionIdentifiersNotSupported.Code: true,
	packets.ErrWildcardSubscriptionsNotSupported.Code:   true,
}

// serverRefused reports whether a link ended by err was ended by the
// server in a way that may be an answer to what it was reading: a
// DISCONNECT with a reason about a message, or the connection closed or
// reset (all a 3.1.1 server can do). A half-open link, a protocol error of
// the server's and our own close are not.
func serverRefused(err error) bool {
	var de *mqttclient.DisconnectError
	switch {
	case err == nil, errors.Is(err, mqttclient.ErrHalfOpen):
		return false
	case errors.As(err, &de):
		return !notTheMessage[de.Code]
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// versionName names an MQTT protocol version for the log.
func versionName(v byte) string {
	if v == 4 {
		return "3.1.1"
	}
	return "5"
}
