package bridge

// The upstream client: one MQTT connection from the gateway to the cloud
// broker, on the packets codec the embedded broker uses. A Client is one
// connection, not a session manager: when it ends, the bridge dials a new
// one (spaced by Backoff) and resends what was not acknowledged.
//
// Three goroutines serve a connection. The reader decodes what the server
// sends, runs OnMessage and answers it; the writer drains a byte-bounded
// queue into the socket, so that a full queue makes callers wait rather
// than grow memory; the watchdog sends PINGREQ when nothing was sent for a
// keep alive period and ends the connection with ErrHalfOpen when an
// acknowledgement is overdue. The reader owns the end of the connection:
// it stops the other two, waits for them, and reports the connection's
// error to every callback still waiting.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/matcher"
)

// ClientOptions configures one upstream connection.
type ClientOptions struct {
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

// Info is what the server said in CONNACK.
type Info struct {
	Version          byte          // 5 or 4
	SessionPresent   bool          // the server resumed a session for this client id
	ReceiveMaximum   int           // the server's (65535 when absent, and on 3.1.1)
	SubIDsAvailable  bool          // false on 3.1.1 or when the server says so
	MaxQoS           byte          // the highest QoS the server accepts; Publish downgrades to it
	RetainAvailable  bool          // false: Publish clears the retain flag
	MaxPacketSize    int           // 0: no limit
	AssignedClientID string        // the client id the server chose for an empty ClientID
	ServerKeepAlive  time.Duration // 0: the server kept ours
}

// Incoming is a PUBLISH from the server.
type Incoming struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
	Dup     bool                // the server says it may have sent this before
	SubIDs  []int               // subscription identifiers of the matching subscriptions (MQTT 5)
	Props   *packets.Properties // MQTT 5 properties; nil on 3.1.1
}

// Outgoing is a PUBLISH to the server.
type Outgoing struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
	Props   *packets.Properties // may be nil; topic alias and subscription identifiers are not sent
	// PacketID 0: the client assigns one. Non-zero with Dup: a resend of
	// an unacknowledged message after reconnecting with a session present
	// [MQTT-4.4.0-1].
	PacketID uint16
	Dup      bool
}

// Subscription is one filter to subscribe.
type Subscription struct {
	Filter            string
	QoS               byte
	NoLocal           bool // MQTT 5 only
	RetainAsPublished bool // MQTT 5 only
	RetainHandling    byte // MQTT 5 only
	ID                int  // subscription identifier, 0 for none (MQTT 5 only)
}

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

// Received is the inbound QoS 2 state of a session: the packet ids of
// messages delivered and acknowledged with PUBREC but not yet released
// with PUBREL. Until the PUBREL, a PUBLISH with the same id is answered
// with PUBREC and not delivered again [MQTT-4.3.3-10]; the server resends
// one after a reconnect when our PUBREC was lost with the link. Share one
// Received between the successive connections of a session; Dial empties
// it when the server has no session. The zero value is ready to use.
type Received struct {
	mu  sync.Mutex
	ids map[uint16]struct{}
}

// Len returns the number of messages waiting for their PUBREL.
func (r *Received) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

func (r *Received) has(pid uint16) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[pid]
	return ok
}

func (r *Received) add(pid uint16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = make(map[uint16]struct{})
	}
	r.ids[pid] = struct{}{}
}

// release forgets pid and reports whether it was there.
func (r *Received) release(pid uint16) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[pid]
	delete(r.ids, pid)
	return ok
}

func (r *Received) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.ids)
}

// Defaults for zero durations in ClientOptions.
const (
	defaultConnectTimeout = 30 * time.Second
	defaultAckTimeout     = 30 * time.Second
)

// writeQueueBytes bounds the bytes waiting for (or in) a write. It is a
// few hundred typical sensor messages: enough to keep the link busy
// between the writer's wake-ups, small next to a Pi's memory. A single
// larger message still goes, alone.
const writeQueueBytes = 256 << 10

// I/O buffer sizes: one TCP segment or TLS record's worth and more.
const (
	readBufSize  = 16 << 10
	writeBufSize = 32 << 10
)

// maxPacket is the largest packet MQTT can frame: a four-byte remaining
// length of 268,435,455 plus the header (§1.5.5).
const maxPacket = 1 + 4 + 268435455

// busyRecheck is how soon the watchdog looks again when a PINGREQ is due
// but the write queue is not empty: whatever is queued resets the keep
// alive once written, and a stuck write has its own deadline.
const busyRecheck = 100 * time.Millisecond

var pingreq = []byte{packets.Pingreq << 4, 0}

// Client is one connection to the upstream broker. Its methods are safe
// for concurrent use.
type Client struct {
	o         ClientOptions
	nc        net.Conn
	br        *bufio.Reader
	info      Info
	v5        bool
	window    int
	keepAlive time.Duration // the interval between PINGREQs on an idle link
	received  *Received
	desc      string // "host:port (MQTT 5)", for errors

	q    writeQueue
	stop chan struct{}  // closed when the connection starts to end
	done chan struct{}  // closed when it has ended and every callback has run
	wg   sync.WaitGroup // the writer and the watchdog

	closeOnce sync.Once

	mu            sync.Mutex
	err           error // why it ended; nil while up and after a clean Close
	failed        bool  // the end has begun: stop is closed
	closing       bool  // Close was called
	ended         bool  // flights and ctrl were handed to the teardown
	flights       map[uint16]*flight
	reserved      map[uint16]struct{} // identifiers taken by ReserveID for a Publish to come
	ctrl          map[uint16]*ctrlWait
	nextID        uint16
	lastSent      time.Time
	acks          []*ackWait // awaited acknowledgements in the order written, so by deadline
	acksCompactAt int        // len(acks) at which the writer next drops the answered ones
	ping          *ackWait   // the PINGREQ in flight, nil when none
}

// flight is an outbound QoS 1/2 PUBLISH (or a PUBREL from Release) that
// awaits its last acknowledgement.
type flight struct {
	qos  byte
	rel  bool // PUBREC received, PUBREL sent (or held for ReleaseHeld): awaiting PUBCOMP
	held bool // PUBREC received, PUBREL held back until ReleaseHeld
	done func(err error, reason byte)
	wait *ackWait
}

// ctrlWait is a SUBSCRIBE or UNSUBSCRIBE awaiting its acknowledgement.
type ctrlWait struct {
	wait *ackWait
	res  chan ctrlResult // buffered: the reader never blocks on it
}

type ctrlResult struct {
	reasons []byte
	err     error
}

// ackWait is one acknowledgement the connection waits for. The writer sets
// its deadline when the packet that asks for it has been written; the
// watchdog ends the connection when one is overdue.
type ackWait struct {
	kind     byte // the packet type awaited
	pid      uint16
	deadline time.Time
	got      bool
}

func (w *ackWait) String() string {
	if w.kind == packets.Pingresp {
		return "PINGRESP"
	}
	return fmt.Sprintf("%s for packet id %d", strings.ToUpper(packetName(w.kind)), w.pid)
}

// Dial connects to the server, sends CONNECT and waits for CONNACK. A
// refusal returns an error wrapping a *RefusedError (and ErrRefused). With
// Protocol 0 it first tries MQTT 5 and falls back to 3.1.1 when the server
// refuses 5: a CONNACK with reason 0x84, a 3.1.1 CONNACK with return code
// 1, or the connection closed in answer to the CONNECT.
func Dial(ctx context.Context, o ClientOptions) (*Client, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = defaultConnectTimeout
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = defaultAckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	versions := []byte{o.Protocol}
	if o.Protocol == 0 {
		versions = []byte{5, 4}
	}
	c, fallback, err := dialVersion(ctx, o, versions[0])
	if err == nil {
		return c, nil
	}
	if !fallback || len(versions) == 1 {
		return nil, fmt.Errorf("bridge: connect to %s with %s: %w", o.Address, versionName(versions[0]), err)
	}
	refusal := err
	if c, _, err = dialVersion(ctx, o, 4); err != nil {
		return nil, fmt.Errorf("bridge: connect to %s with MQTT 3.1.1, after MQTT 5 failed (%v): %w", o.Address, refusal, err)
	}
	return c, nil
}

// check reports every problem with the options at once.
func (o *ClientOptions) check() error {
	var errs []error
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		errs = append(errs, fmt.Errorf("option Address %q is not host:port: %w", o.Address, err))
	}
	if o.Protocol != 0 && o.Protocol != 4 && o.Protocol != 5 {
		errs = append(errs, fmt.Errorf("option Protocol %d: want 5, 4 (3.1.1) or 0 (5, falling back to 4)", o.Protocol))
	}
	if o.KeepAlive < 0 || o.KeepAlive > 65535*time.Second {
		errs = append(errs, fmt.Errorf("option KeepAlive %v: want 0 to 65535s", o.KeepAlive))
	}
	if o.SessionExpiry < 0 || o.SessionExpiry > 0xFFFFFFFF*time.Second {
		errs = append(errs, fmt.Errorf("option SessionExpiry %v: want 0 to 4294967295s", o.SessionExpiry))
	}
	if o.MaxInflight < 0 {
		errs = append(errs, fmt.Errorf("option MaxInflight %d: want 0 (no cap of ours) or more", o.MaxInflight))
	}
	if len(o.ClientID) > 65535 || len(o.Username) > 65535 || len(o.Password) > 65535 {
		errs = append(errs, errors.New("options ClientID, Username and Password must each be at most 65535 bytes"))
	}
	if w := o.Will; w != nil {
		if err := matcher.ValidateTopic(w.Topic); err != nil {
			errs = append(errs, fmt.Errorf("option Will.Topic: %w", err))
		}
		if w.QoS > 2 {
			errs = append(errs, fmt.Errorf("option Will.QoS %d: want 0, 1 or 2", w.QoS))
		}
		if len(w.Payload) > 65535 {
			errs = append(errs, fmt.Errorf("option Will.Payload of %d bytes: at most 65535", len(w.Payload)))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("bridge: %w", errors.Join(errs...))
}

// dialVersion makes one connection attempt with protocol version v.
// fallback reports a refusal of MQTT 5 that 3.1.1 may get past.
func dialVersion(ctx context.Context, o ClientOptions, v byte) (c *Client, fallback bool, err error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", o.Address)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(o.Address)
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, false, fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	// ctx bounds CONNECT and CONNACK: its deadline as the socket's, and
	// its cancellation as a deadline in the past.
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	interrupt := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	br := bufio.NewReaderSize(nc, readBufSize)
	fh, body, err := connectOnce(nc, br, o, v)
	if !interrupt() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket's deadline is ctx's, which may fire a moment
			// before ctx itself says so.
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			err = fmt.Errorf("no CONNACK: %w", cause)
		}
		var ce *connackError
		if v == 5 && errors.As(err, &ce) && closedEarly(err) {
			return nil, true, fmt.Errorf("server closed the connection after an MQTT 5 CONNECT: %w", err)
		}
		return nil, false, err
	}
	_ = nc.SetDeadline(time.Time{})

	if fh.Type != packets.Connack {
		return nil, false, fmt.Errorf("server sent %s before CONNACK", strings.ToUpper(packetName(fh.Type)))
	}
	if v == 5 && len(body) >= 2 && body[1] == 0x01 {
		// A 3.1.1 server's return code 1, "unacceptable protocol
		// version"; no MQTT 5 CONNACK uses 0x01 (§3.2.2.2).
		return nil, true, &RefusedError{Version: 4, Code: 1}
	}
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: v}
	if err := decode(&pk, body, (*packets.Packet).ConnackDecode); err != nil {
		return nil, false, err
	}
	if pk.ReasonCode != 0 {
		if v == 5 && pk.ReasonCode < 0x80 {
			return nil, false, fmt.Errorf("CONNACK with reason 0x%02X, which is not a CONNACK code", pk.ReasonCode)
		}
		re := &RefusedError{Version: v, Code: pk.ReasonCode, Reason: pk.Properties.ReasonString, ServerReference: pk.Properties.ServerReference}
		return nil, v == 5 && pk.ReasonCode == 0x84, re
	}
	return newClient(o, nc, br, v, &pk), false, nil
}

// connectOnce writes CONNECT and reads the first packet back through br,
// which the connection goes on reading with: the server may send more
// right behind CONNACK.
func connectOnce(nc net.Conn, br *bufio.Reader, o ClientOptions, v byte) (packets.FixedHeader, []byte, error) {
	if _, err := nc.Write(connectPacket(o, v)); err != nil {
		return packets.FixedHeader{}, nil, fmt.Errorf("write CONNECT: %w", err)
	}
	fh, body, err := readPacket(br, 0)
	if err != nil {
		return fh, nil, &connackError{err}
	}
	return fh, body, nil
}

// connackError is a failure to read CONNACK after CONNECT was written;
// only such a close, not one before the CONNECT, says the server will not
// have MQTT 5.
type connackError struct{ err error }

func (e *connackError) Error() string { return "read CONNACK: " + e.err.Error() }
func (e *connackError) Unwrap() error { return e.err }

// closedEarly reports an error that means the server closed the socket.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func connectPacket(o ClientOptions, v byte) []byte {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: v,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: o.ClientID,
			// Rounded up: the server's limit is 1.5 times what we
			// announce, and we ping every KeepAlive.
			Keepalive:    uint16((o.KeepAlive + time.Second - 1) / time.Second),
			Clean:        o.CleanStart,
			Username:     []byte(o.Username),
			UsernameFlag: o.Username != "",
			Password:     o.Password,
			PasswordFlag: len(o.Password) > 0,
		},
	}
	expiry := uint32((o.SessionExpiry + time.Second - 1) / time.Second)
	if v == 5 {
		pk.Properties.SessionExpiryInterval = expiry
		pk.Properties.SessionExpiryIntervalFlag = expiry > 0
		// No Topic Alias Maximum: absent means 0, so the server sends
		// every topic in full [MQTT-3.1.2-27] and we keep no alias table.
	} else {
		// 3.1.1 cannot keep a session past the connection and yet start
		// clean: a session to keep wins.
		pk.Connect.Clean = expiry == 0
	}
	if w := o.Will; w != nil {
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = w.Topic
		pk.Connect.WillPayload = w.Payload
		pk.Connect.WillQos = w.QoS
		pk.Connect.WillRetain = w.Retain
	}
	return encode(&pk, (*packets.Packet).ConnectEncode)
}

func newClient(o ClientOptions, nc net.Conn, br *bufio.Reader, v byte, ack *packets.Packet) *Client {
	c := &Client{
		o:        o,
		nc:       nc,
		br:       br,
		v5:       v == 5,
		received: o.Received,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		flights:  make(map[uint16]*flight),
		ctrl:     make(map[uint16]*ctrlWait),
		lastSent: time.Now(),
	}
	c.q.init()
	c.info = Info{Version: v, SessionPresent: ack.SessionPresent, ReceiveMaximum: 65535, MaxQoS: 2, RetainAvailable: true}
	if c.v5 {
		p := &ack.Properties
		if p.ReceiveMaximum > 0 {
			c.info.ReceiveMaximum = int(p.ReceiveMaximum)
		}
		c.info.SubIDsAvailable = !p.SubIDAvailableFlag || p.SubIDAvailable == 1
		if p.MaximumQosFlag && p.MaximumQos < 2 {
			c.info.MaxQoS = p.MaximumQos
		}
		c.info.RetainAvailable = !p.RetainAvailableFlag || p.RetainAvailable == 1
		c.info.MaxPacketSize = int(p.MaximumPacketSize)
		c.info.AssignedClientID = p.AssignedClientID
		if p.ServerKeepAliveFlag {
			c.info.ServerKeepAlive = time.Duration(p.ServerKeepAlive) * time.Second
		}
	}
	c.keepAlive = o.KeepAlive
	if ska := c.info.ServerKeepAlive; ska > 0 && (c.keepAlive == 0 || ska < c.keepAlive) {
		// The server's value replaces ours [MQTT-3.2.2-21]; pinging more
		// often than it asks is harmless, so a shorter one of ours stays.
		c.keepAlive = ska
	}
	c.window = c.info.ReceiveMaximum
	if o.MaxInflight > 0 {
		c.window = min(c.window, o.MaxInflight)
	}
	if c.received == nil {
		c.received = &Received{}
	}
	if !c.info.SessionPresent {
		c.received.reset() // a new session knows none of the old ids
	}
	c.desc = fmt.Sprintf("%s (%s)", o.Address, versionName(v))
	c.wg.Add(2)
	go c.writeLoop()
	go c.watch()
	go c.readLoop()
	return c
}

// Info returns what the server said in CONNACK.
func (c *Client) Info() Info { return c.info }

// Window returns how many QoS 1/2 publishes may be in flight:
// min(MaxInflight, the server's Receive Maximum).
func (c *Client) Window() int { return c.window }

// Inflight returns the QoS 1/2 publishes awaiting their final
// acknowledgement.
func (c *Client) Inflight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.flights)
}

// Done returns a channel closed when the connection has ended and every
// callback has run.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended: nil while it is up and after a
// clean Close.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// endErr is the error of calls made and callbacks run once the connection
// is ending.
func (c *Client) endErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endErrLocked()
}

func (c *Client) endErrLocked() error {
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

// usableLocked returns the error that stops a new operation, if any.
func (c *Client) usableLocked() error {
	if c.failed || c.closing {
		return c.endErrLocked()
	}
	return nil
}

// Publish sends m. QoS 0: done(nil, 0) once written. QoS 1: done on
// PUBACK with its reason code; QoS 2: done on PUBCOMP (the client sends
// PUBREL on PUBREC itself); a PUBREC with a failure code ends the flow and
// calls done with it. If the connection ends first, done gets the
// connection's error (ErrClosed after Close), joined with
// ErrReleasePending for a QoS 2 message past PUBREC. done runs on one of
// the client's goroutines and must not block, nor call Publish, which can
// wait for room in the write queue; it is not called when Publish returns
// an error. Publish encodes m before it returns: the caller may reuse it.
//
// A QoS above the server's Maximum QoS is lowered to it, and the retain
// flag is cleared when the server has no retain (see Info). A message
// above the server's Maximum Packet Size returns ErrTooLarge. A full
// in-flight window returns ErrWindowFull without sending. QoS 0 messages
// wait for room in the write queue. After reconnecting with a session
// present, resend the unacknowledged messages (Dup and their PacketID)
// before publishing new ones, so that no new message takes an id the
// server still holds.
func (c *Client) Publish(m *Outgoing, done func(err error, reason byte)) (pid uint16, err error) {
	if err := matcher.ValidateTopic(m.Topic); err != nil {
		return 0, fmt.Errorf("bridge: publish: %w", err)
	}
	if m.QoS > 2 {
		return 0, fmt.Errorf("bridge: publish to %q: QoS %d, want 0, 1 or 2", m.Topic, m.QoS)
	}
	if done == nil {
		done = func(error, byte) {}
	}
	qos := min(m.QoS, c.info.MaxQoS)             // [MQTT-3.2.2-11]
	retain := m.Retain && c.info.RetainAvailable // [MQTT-3.2.2-14]
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain, Dup: m.Dup && qos > 0}, // [MQTT-3.3.1-2]
		ProtocolVersion: c.info.Version,
		TopicName:       m.Topic,
		Payload:         m.Payload,
		// The codec leaves out response topic and correlation data
		// without this; a PUBLISH passes them on.
		Mods: packets.Mods{AllowResponseInfo: true},
	}
	if m.Props != nil && c.v5 {
		pk.Properties = *m.Props
		pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag = 0, false
		pk.Properties.SubscriptionIdentifier = nil // [MQTT-3.3.4-6]
	}
	if qos > 0 {
		pk.PacketID = 0xFFFF // a placeholder of the right size, set below
	}
	b := encode(&pk, (*packets.Packet).PublishEncode)
	if limit := c.info.MaxPacketSize; limit > 0 && len(b) > limit {
		return 0, fmt.Errorf("%w: PUBLISH to %q is %d bytes, %s accepts at most %d", ErrTooLarge, m.Topic, len(b), c.o.Address, limit)
	}
	if qos == 0 {
		if !c.q.push(outPacket{b: b, sent: done}, false) {
			return 0, c.endErr()
		}
		return 0, nil
	}

	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	pid = m.PacketID
	if _, ok := c.reserved[pid]; ok && pid != 0 {
		delete(c.reserved, pid) // its place in the window was taken with it
	} else if len(c.flights)+len(c.reserved) >= c.window {
		c.mu.Unlock()
		return 0, ErrWindowFull
	} else if pid != 0 {
		if c.inUseLocked(pid) {
			c.mu.Unlock()
			return 0, fmt.Errorf("bridge: publish to %q: packet id %d is still in flight", m.Topic, pid)
		}
	} else if pid = c.allocIDLocked(); pid == 0 {
		c.mu.Unlock()
		return 0, errors.New("bridge: publish: every packet id is in flight")
	}
	kind := byte(packets.Puback)
	if qos == 2 {
		kind = packets.Pubrec
	}
	f := &flight{qos: qos, done: done, wait: &ackWait{kind: kind, pid: pid}}
	c.flights[pid] = f
	c.mu.Unlock()

	binary.BigEndian.PutUint16(b[publishIDOffset(b, m.Topic):], pid)
	return c.sendFlight(pid, f, b)
}

// sendFlight queues the packet of a flight registered under pid. Should
// the connection end first, the flight is withdrawn and the error returned
// unless the teardown already has it and will call its done.
func (c *Client) sendFlight(pid uint16, f *flight, b []byte) (uint16, error) {
	if c.q.push(outPacket{b: b, wait: f.wait}, false) {
		return pid, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended && c.flights[pid] == f {
		delete(c.flights, pid)
		return 0, c.endErrLocked()
	}
	return pid, nil
}

// publishIDOffset returns where the packet id sits in an encoded PUBLISH:
// after the fixed header and the topic.
func publishIDOffset(b []byte, topic string) int {
	i := 1
	for b[i]&0x80 != 0 {
		i++
	}
	return i + 1 + 2 + len(topic)
}

// Release resends PUBREL for pid, a QoS 2 message that had its PUBREC
// before a reconnect with a session present (its done error matched
// ErrReleasePending); done is called as for Publish, on PUBCOMP.
func (c *Client) Release(pid uint16, done func(err error, reason byte)) error {
	if pid == 0 {
		return errors.New("bridge: release: packet id 0")
	}
	if done == nil {
		done = func(error, byte) {}
	}
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	if len(c.flights)+len(c.reserved) >= c.window {
		c.mu.Unlock()
		return ErrWindowFull
	}
	if c.inUseLocked(pid) {
		c.mu.Unlock()
		return fmt.Errorf("bridge: release: packet id %d is still in flight", pid)
	}
	f := &flight{qos: 2, rel: true, done: done, wait: &ackWait{kind: packets.Pubcomp, pid: pid}}
	c.flights[pid] = f
	c.mu.Unlock()
	_, err := c.sendFlight(pid, f, ackPacket(packets.Pubrel, pid, 0, c.v5))
	return err
}

// ReserveID takes a packet identifier, and a place in the in-flight
// window, for a QoS 1/2 Publish to come: the caller can record the
// identifier before the PUBLISH goes out. Publish with m.PacketID set to
// it uses them; CancelID gives them back. A full window returns
// ErrWindowFull.
func (c *Client) ReserveID() (uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return 0, err
	}
	if len(c.flights)+len(c.reserved) >= c.window {
		return 0, ErrWindowFull
	}
	pid := c.allocIDLocked()
	if pid == 0 {
		return 0, errors.New("bridge: every packet id is in flight")
	}
	if c.reserved == nil {
		c.reserved = map[uint16]struct{}{}
	}
	c.reserved[pid] = struct{}{}
	return pid, nil
}

// CancelID gives back an identifier from ReserveID that no Publish used.
func (c *Client) CancelID(pid uint16) {
	c.mu.Lock()
	delete(c.reserved, pid)
	c.mu.Unlock()
}

// ReleaseHeld sends the PUBREL that OnPubrec held back for pid; the
// message's done is called on PUBCOMP. It returns an error when pid has
// no held PUBREL, or the connection ended (done then gets
// ErrReleasePending).
func (c *Client) ReleaseHeld(pid uint16) error {
	c.mu.Lock()
	f := c.flights[pid]
	if f == nil || !f.held {
		err := c.usableLocked()
		c.mu.Unlock()
		if err != nil {
			return err
		}
		return fmt.Errorf("bridge: release: packet id %d has no PUBREL held", pid)
	}
	f.held = false
	f.wait = &ackWait{kind: packets.Pubcomp, pid: pid}
	c.mu.Unlock()
	if !c.q.push(outPacket{b: ackPacket(packets.Pubrel, pid, 0, c.v5), wait: f.wait}, false) {
		return c.endErr()
	}
	return nil
}

func (c *Client) inUseLocked(pid uint16) bool {
	_, a := c.flights[pid]
	_, b := c.ctrl[pid]
	_, r := c.reserved[pid]
	return a || b || r
}

// allocIDLocked returns a packet id no PUBLISH, SUBSCRIBE or UNSUBSCRIBE
// in flight holds [MQTT-2.2.1-3], or 0 when all are taken.
func (c *Client) allocIDLocked() uint16 {
	for range 65535 {
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1
		}
		if !c.inUseLocked(c.nextID) {
			return c.nextID
		}
	}
	return 0
}

// Subscribe subscribes to subs and returns a reason code per filter, in
// order (a granted QoS, or a failure at 0x80 and above). It waits for the
// SUBACKs: until ctx ends or the connection does, which it does when they
// are later than AckTimeout. MQTT 5 carries one subscription identifier per
// SUBSCRIBE, so subs with different IDs go in separate packets.
func (c *Client) Subscribe(ctx context.Context, subs []Subscription) (reasons []byte, err error) {
	if len(subs) == 0 {
		return nil, errors.New("bridge: subscribe: no subscriptions") // [MQTT-3.8.3-2]
	}
	var errs []error
	for _, s := range subs {
		if err := matcher.ValidateFilter(s.Filter); err != nil {
			errs = append(errs, err)
		}
		if s.QoS > 2 || s.RetainHandling > 2 {
			errs = append(errs, fmt.Errorf("filter %q: QoS %d and retain handling %d, want each 0, 1 or 2", s.Filter, s.QoS, s.RetainHandling))
		}
		if s.ID < 0 || s.ID > 268435455 {
			errs = append(errs, fmt.Errorf("filter %q: subscription identifier %d, want 1 to 268435455 or 0 for none", s.Filter, s.ID))
		}
		if s.ID != 0 && !c.info.SubIDsAvailable {
			errs = append(errs, fmt.Errorf("filter %q: subscription identifier %d, but %s has no subscription identifiers", s.Filter, s.ID, c.desc))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("bridge: subscribe: %w", errors.Join(errs...))
	}
	// Runs of equal IDs share a packet.
	var groups [][]Subscription
	for i, s := range subs {
		if i == 0 || (c.v5 && s.ID != subs[i-1].ID) {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], s)
	}
	waits, err := c.sendCtrl(packets.Suback, len(groups), func(i int, pid uint16) []byte {
		g := groups[i]
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, // [MQTT-3.8.1-1]
			ProtocolVersion: c.info.Version,
			PacketID:        pid,
		}
		if g[0].ID != 0 {
			pk.Properties.SubscriptionIdentifier = []int{g[0].ID}
		}
		for _, s := range g {
			pk.Filters = append(pk.Filters, packets.Subscription{
				Filter: s.Filter, Qos: s.QoS, NoLocal: s.NoLocal,
				RetainAsPublished: s.RetainAsPublished, RetainHandling: s.RetainHandling,
			})
		}
		return encode(&pk, (*packets.Packet).SubscribeEncode)
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: subscribe: %w", err)
	}
	for i, w := range waits {
		select {
		case r := <-w.res:
			if r.err != nil {
				return nil, fmt.Errorf("bridge: subscribe: %w", r.err)
			}
			if len(r.reasons) != len(groups[i]) {
				return nil, fmt.Errorf("bridge: subscribe: SUBACK has %d reason codes for %d filters", len(r.reasons), len(groups[i]))
			}
			reasons = append(reasons, r.reasons...)
		case <-ctx.Done():
			return nil, fmt.Errorf("bridge: subscribe: no SUBACK: %w", ctx.Err())
		}
	}
	return reasons, nil
}

// Unsubscribe removes filters and waits for the UNSUBACK as Subscribe
// waits for SUBACK. A filter the server refuses (MQTT 5) is an error;
// one that was not subscribed is not.
func (c *Client) Unsubscribe(ctx context.Context, filters []string) error {
	if len(filters) == 0 {
		return errors.New("bridge: unsubscribe: no filters") // [MQTT-3.10.3-2]
	}
	for _, f := range filters {
		if err := matcher.ValidateFilter(f); err != nil {
			return fmt.Errorf("bridge: unsubscribe: %w", err)
		}
	}
	waits, err := c.sendCtrl(packets.Unsuback, 1, func(_ int, pid uint16) []byte {
		pk := packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Unsubscribe, Qos: 1}, // [MQTT-3.10.1-1]
			ProtocolVersion: c.info.Version,
			PacketID:        pid,
		}
		for _, f := range filters {
			pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
		}
		return encode(&pk, (*packets.Packet).UnsubscribeEncode)
	})
	if err != nil {
		return fmt.Errorf("bridge: unsubscribe: %w", err)
	}
	var r ctrlResult
	select {
	case r = <-waits[0].res:
	case <-ctx.Done():
		return fmt.Errorf("bridge: unsubscribe: no UNSUBACK: %w", ctx.Err())
	}
	if r.err != nil {
		return fmt.Errorf("bridge: unsubscribe: %w", r.err)
	}
	var errs []error
	for i, code := range r.reasons {
		if code >= 0x80 && i < len(filters) {
			errs = append(errs, fmt.Errorf("filter %q: %s (0x%02X)", filters[i], reasonName(code), code))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("bridge: unsubscribe refused: %w", errors.Join(errs...))
	}
	return nil
}

// sendCtrl registers n SUBSCRIBE or UNSUBSCRIBE packets built by build
// under fresh packet ids and queues them. Their ids stay taken until the
// acknowledgement comes or the connection ends, even when the caller
// stops waiting.
func (c *Client) sendCtrl(ackKind byte, n int, build func(i int, pid uint16) []byte) ([]*ctrlWait, error) {
	waits := make([]*ctrlWait, n)
	pids := make([]uint16, n)
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	for i := range waits {
		pid := c.allocIDLocked()
		if pid == 0 {
			for _, p := range pids[:i] {
				delete(c.ctrl, p)
			}
			c.mu.Unlock()
			return nil, errors.New("every packet id is in flight")
		}
		w := &ctrlWait{wait: &ackWait{kind: ackKind, pid: pid}, res: make(chan ctrlResult, 1)}
		c.ctrl[pid], waits[i], pids[i] = w, w, pid
	}
	c.mu.Unlock()
	for i, w := range waits {
		if !c.q.push(outPacket{b: build(i, pids[i]), wait: w.wait}, false) {
			// The teardown answers every wait still registered.
			break
		}
	}
	return waits, nil
}

// Close sends DISCONNECT (normal disconnection), closes the connection
// and waits for its goroutines. Callbacks still waiting get ErrClosed.
// Err stays nil unless the connection had already failed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		d := []byte{packets.Disconnect << 4, 0}
		if c.v5 {
			d = []byte{packets.Disconnect << 4, 1, 0} // reason 0x00
		}
		c.q.push(outPacket{b: d, last: true}, true)
	})
	<-c.done
	return nil
}

// fail starts the end of the connection; err nil is a clean close. Only
// the first call counts.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.failed {
		c.mu.Unlock()
		return
	}
	c.failed = true
	if err != nil {
		// A clean close keeps an error the reader set before sending
		// its DISCONNECT.
		c.err = err
	}
	c.mu.Unlock()
	c.q.close()
	close(c.stop)
	c.nc.Close()
}

// progressWriter writes to the socket in chunks, each with its own
// deadline: a write that makes no progress for AckTimeout means the server
// (or the path to it) stopped reading, the same silence an overdue ack
// shows. A deadline per chunk rather than per batch keeps a slow but
// moving link from looking dead.
type progressWriter struct{ c *Client }

func (w progressWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if err := w.c.nc.SetWriteDeadline(time.Now().Add(w.c.o.AckTimeout)); err != nil {
			return n, err
		}
		m, err := w.c.nc.Write(p[n:min(len(p), n+writeBufSize)])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeLoop is the writer goroutine.
func (c *Client) writeLoop() {
	defer c.wg.Done()
	bw := bufio.NewWriterSize(progressWriter{c}, writeBufSize)
	for {
		items, ok := c.q.take()
		if !ok {
			return
		}
		var err error
		size := 0
		for _, it := range items {
			size += len(it.b)
			if err == nil {
				_, err = bw.Write(it.b)
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: a write to %s blocked for %v", ErrHalfOpen, c.desc, c.o.AckTimeout)
			} else {
				err = c.lostErr(err)
			}
			c.fail(err)
			err = c.endErr()
			for _, it := range items {
				if it.sent != nil {
					it.sent(err, 0)
				}
			}
			return
		}
		now := time.Now()
		last := false
		c.mu.Lock()
		c.lastSent = now
		for _, it := range items {
			if it.wait != nil && !it.wait.got {
				it.wait.deadline = now.Add(c.o.AckTimeout)
				c.acks = append(c.acks, it.wait)
			}
			last = last || it.last
		}
		c.compactAcksLocked()
		c.mu.Unlock()
		c.q.release(size)
		for _, it := range items {
			if it.sent != nil {
				it.sent(nil, 0)
			}
		}
		if last {
			c.fail(nil)
			return
		}
	}
}

// compactAcksLocked drops answered waits from c.acks once it has doubled.
// The watchdog drops them from the front, but one slow acknowledgement
// there would let the answered ones behind it pile up for AckTimeout.
func (c *Client) compactAcksLocked() {
	if len(c.acks) < c.acksCompactAt {
		return
	}
	c.acks = slices.DeleteFunc(c.acks, func(w *ackWait) bool { return w.got })
	c.acksCompactAt = max(64, 2*len(c.acks))
}

// watch is the watchdog goroutine: keep alive and overdue acks.
func (c *Client) watch() {
	defer c.wg.Done()
	t := time.NewTimer(0) // the first check says when the next is due
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		next, err := c.check(now)
		if err != nil {
			c.fail(err)
			return
		}
		t.Reset(next.Sub(now))
	}
}

// check fails an overdue acknowledgement, queues a PINGREQ when one is
// due, and returns when to look again.
func (c *Client) check(now time.Time) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(c.acks) && c.acks[i].got {
		i++
	}
	if i > 0 {
		c.acks = c.acks[:copy(c.acks, c.acks[i:])]
	}
	// Anything awaited later than now is written later, so its deadline
	// is later than this.
	next := now.Add(c.o.AckTimeout)
	if len(c.acks) > 0 {
		w := c.acks[0]
		if !now.Before(w.deadline) {
			return now, fmt.Errorf("%w: no %s from %s within %v", ErrHalfOpen, w, c.desc, c.o.AckTimeout)
		}
		next = w.deadline
	}
	if c.keepAlive > 0 && c.ping == nil {
		due := c.lastSent.Add(c.keepAlive)
		if !now.Before(due) {
			w := &ackWait{kind: packets.Pingresp}
			if c.q.tryPush(outPacket{b: pingreq, wait: w}) {
				c.ping = w
				due = now.Add(c.keepAlive)
			} else {
				due = now.Add(busyRecheck)
			}
		}
		if due.Before(next) {
			next = due
		}
	}
	return next, nil
}

// readLoop is the reader goroutine, and it ends the connection.
func (c *Client) readLoop() {
	err := c.readPackets()
	var pe *protocolError
	var de *DisconnectError
	if errors.As(err, &pe) || errors.As(err, &de) {
		err = fmt.Errorf("bridge: %s: %w", c.desc, err)
	}
	if pe != nil && c.v5 {
		// Tell the server why (§4.13); the writer closes once it is
		// written, or the deadline does.
		d := encode(&packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Disconnect},
			ProtocolVersion: 5,
			ReasonCode:      pe.code,
		}, (*packets.Packet).DisconnectEncode)
		c.mu.Lock()
		c.err = err // kept by the writer's fail(nil), which comes first
		c.mu.Unlock()
		if c.q.push(outPacket{b: d, last: true}, true) {
			select {
			case <-c.stop:
			case <-time.After(c.o.AckTimeout):
			}
		}
	}
	c.fail(err)
	c.wg.Wait()
	c.teardown()
	close(c.done)
}

// teardown reports the end to every callback and waiter still pending.
func (c *Client) teardown() {
	c.mu.Lock()
	err := c.endErrLocked()
	c.ended = true
	flights, ctrl := c.flights, c.ctrl
	c.flights, c.ctrl = map[uint16]*flight{}, map[uint16]*ctrlWait{}
	c.reserved = nil
	c.acks, c.ping = nil, nil
	c.mu.Unlock()
	for _, it := range c.q.drain() {
		if it.sent != nil {
			it.sent(err, 0)
		}
	}
	for _, pid := range slices.Sorted(maps.Keys(flights)) {
		f := flights[pid]
		if f.rel {
			f.done(fmt.Errorf("%w; %w", err, ErrReleasePending), 0)
		} else {
			f.done(err, 0)
		}
	}
	for _, w := range ctrl {
		w.res <- ctrlResult{err: err}
	}
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

// readPackets reads and handles packets until the connection fails.
func (c *Client) readPackets() error {
	for {
		fh, body, err := readPacket(c.br, 0)
		if err != nil {
			select {
			case <-c.stop:
				return nil // ended on purpose; the cause is already set
			default:
			}
			var pe *protocolError
			if errors.As(err, &pe) {
				return err
			}
			return c.lostErr(err)
		}
		if err := c.handle(fh, body); err != nil {
			return err
		}
	}
}

// handle acts on one packet from the server.
func (c *Client) handle(fh packets.FixedHeader, body []byte) error {
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: c.info.Version}
	switch fh.Type {
	case packets.Publish:
		if err := decode(&pk, body, (*packets.Packet).PublishDecode); err != nil {
			return err
		}
		return c.onPublish(&pk)
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		if err := decode(&pk, body, (*packets.Packet).PubackDecode); err != nil {
			return err
		}
		c.onPubAck(fh.Type, pk.PacketID, pk.ReasonCode)
		return nil
	case packets.Pubrel:
		if err := decode(&pk, body, (*packets.Packet).PubrelDecode); err != nil {
			return err
		}
		code := byte(0)
		if !c.received.release(pk.PacketID) {
			code = 0x92 // packet identifier not found
		}
		c.q.push(outPacket{b: ackPacket(packets.Pubcomp, pk.PacketID, code, c.v5)}, false) // [MQTT-4.3.3-11]
		return nil
	case packets.Suback, packets.Unsuback:
		fn := (*packets.Packet).SubackDecode
		if fh.Type == packets.Unsuback {
			fn = (*packets.Packet).UnsubackDecode
		}
		if err := decode(&pk, body, fn); err != nil {
			return err
		}
		c.mu.Lock()
		w := c.ctrl[pk.PacketID]
		if w == nil || w.wait.kind != fh.Type {
			c.mu.Unlock()
			return nil // nobody waits: a late answer after a cancelled wait was already dropped
		}
		w.wait.got = true
		delete(c.ctrl, pk.PacketID)
		c.mu.Unlock()
		w.res <- ctrlResult{reasons: slices.Clone(pk.ReasonCodes)}
		return nil
	case packets.Pingresp:
		c.mu.Lock()
		if c.ping != nil {
			c.ping.got = true
			c.ping = nil
		}
		c.mu.Unlock()
		return nil
	case packets.Disconnect:
		if !c.v5 {
			return protoErr(0x82, "DISCONNECT from a 3.1.1 server")
		}
		de := &DisconnectError{}
		if len(body) > 0 {
			de.Code = body[0]
		}
		if len(body) > 1 {
			if err := decode(&pk, body, (*packets.Packet).DisconnectDecode); err != nil {
				return err
			}
			de.Reason, de.ServerReference = pk.Properties.ReasonString, pk.Properties.ServerReference
		}
		return de
	default:
		return protoErr(0x82, "the server sent %s", strings.ToUpper(packetName(fh.Type)))
	}
}

// onPublish delivers a PUBLISH and acknowledges it after OnMessage
// returns; a QoS 2 message is delivered once until its PUBREL.
func (c *Client) onPublish(pk *packets.Packet) error {
	qos, pid := pk.FixedHeader.Qos, pk.PacketID
	if qos > 0 && pid == 0 {
		return protoErr(0x82, "PUBLISH QoS %d without a packet id", qos) // [MQTT-2.2.1-3]
	}
	if pk.Properties.TopicAliasFlag {
		// We announced no aliases (Topic Alias Maximum 0) [MQTT-3.1.2-27].
		return protoErr(0x94, "PUBLISH with topic alias %d; we accept none", pk.Properties.TopicAlias)
	}
	if err := matcher.ValidateTopic(pk.TopicName); err != nil {
		return protoErr(0x90, "PUBLISH: %v", err)
	}
	if qos == 2 && c.received.has(pid) {
		// Delivered before; the PUBREC did not arrive [MQTT-4.3.3-10].
		c.q.push(outPacket{b: ackPacket(packets.Pubrec, pid, 0, c.v5)}, false)
		return nil
	}
	if c.o.OnMessage != nil {
		m := &Incoming{
			Topic:   pk.TopicName,
			Payload: pk.Payload,
			QoS:     qos,
			Retain:  pk.FixedHeader.Retain,
			Dup:     pk.FixedHeader.Dup,
		}
		if c.v5 {
			m.SubIDs = pk.Properties.SubscriptionIdentifier
			m.Props = &pk.Properties
		}
		c.o.OnMessage(m)
	}
	switch qos {
	case 1:
		c.q.push(outPacket{b: ackPacket(packets.Puback, pid, 0, c.v5)}, false) // §4.3.2
	case 2:
		c.received.add(pid)
		c.q.push(outPacket{b: ackPacket(packets.Pubrec, pid, 0, c.v5)}, false) // §4.3.3
	}
	return nil
}

// onPubAck handles PUBACK, PUBREC and PUBCOMP for our publishes.
func (c *Client) onPubAck(kind byte, pid uint16, reason byte) {
	c.mu.Lock()
	f := c.flights[pid]
	if f == nil || f.wait.kind != kind {
		c.mu.Unlock()
		if f == nil && kind == packets.Pubrec {
			// Let the server free the id [MQTT-4.3.3-4]; 0x92 says we
			// had nothing under it.
			c.q.push(outPacket{b: ackPacket(packets.Pubrel, pid, 0x92, c.v5)}, false)
		}
		return
	}
	f.wait.got = true
	if kind == packets.Pubrec && reason < 0x80 {
		f.rel = true
		if hold := c.o.OnPubrec; hold != nil {
			if f.held {
				c.mu.Unlock()
				return // a second PUBREC: the first is being recorded
			}
			f.held = true
			c.mu.Unlock()
			hold(pid)
			return
		}
		f.wait = &ackWait{kind: packets.Pubcomp, pid: pid}
		c.mu.Unlock()
		c.q.push(outPacket{b: ackPacket(packets.Pubrel, pid, 0, c.v5), wait: f.wait}, false) // [MQTT-4.3.3-4]
		return
	}
	// PUBACK, PUBCOMP, or a PUBREC that failed the message, which ends
	// its flow [MQTT-4.3.3-4].
	delete(c.flights, pid)
	c.mu.Unlock()
	f.done(nil, reason)
}

// readPacket reads one packet: the fixed header and a fresh body, which the
// decoded packet's strings and payload point into. limit bounds the packet
// size, 0 for MQTT's own limit.
func readPacket(r *bufio.Reader, limit int) (packets.FixedHeader, []byte, error) {
	var fh packets.FixedHeader
	hb, err := r.ReadByte()
	if err != nil {
		return fh, nil, err
	}
	if err := fh.Decode(hb); err != nil {
		return fh, nil, protoErr(0x81, "fixed header 0x%02X: %v", hb, err)
	}
	n, lenBytes := 0, 0
	for shift := 0; ; shift += 7 {
		if lenBytes == 4 {
			return fh, nil, protoErr(0x81, "remaining length of more than four bytes") // §1.5.5
		}
		b, err := r.ReadByte()
		if err != nil {
			return fh, nil, unexpectedEOF(err)
		}
		lenBytes++
		n |= int(b&0x7F) << shift
		if b&0x80 == 0 {
			break
		}
	}
	if limit == 0 {
		limit = maxPacket
	}
	if 1+lenBytes+n > limit {
		return fh, nil, protoErr(0x95, "packet of %d bytes, above %d", 1+lenBytes+n, limit)
	}
	fh.Remaining = n
	// Grown as bytes arrive, so a length the server announces but never
	// sends costs nothing.
	body := make([]byte, 0, min(n, readBufSize))
	for len(body) < n {
		if len(body) == cap(body) {
			body = slices.Grow(body, min(n-len(body), cap(body)))
		}
		m, err := r.Read(body[len(body):min(cap(body), n)])
		body = body[:len(body)+m]
		if err != nil && len(body) < n {
			return fh, nil, unexpectedEOF(err)
		}
	}
	return fh, body, nil
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decode runs a codec decoder under recover: the codec panics on some
// truncated inputs, and a bad packet from the server must end the
// connection, not the gateway.
func decode(pk *packets.Packet, body []byte, fn func(*packets.Packet, []byte) error) (err error) {
	name := strings.ToUpper(packetName(pk.FixedHeader.Type))
	defer func() {
		if r := recover(); r != nil {
			err = protoErr(0x81, "malformed %s", name)
		}
	}()
	if err := fn(pk, body); err != nil {
		return protoErr(0x81, "malformed %s: %v", name, err)
	}
	return nil
}

// encode runs a codec encoder into a fresh slice.
func encode(pk *packets.Packet, fn func(*packets.Packet, *bytes.Buffer) error) []byte {
	var buf bytes.Buffer
	_ = fn(pk, &buf) // errors only for a missing packet id, which we always set
	return buf.Bytes()
}

// ackPacket encodes PUBACK, PUBREC, PUBREL or PUBCOMP. Success without
// properties is the short form both versions share [MQTT-3.4.2-1].
func ackPacket(kind byte, pid uint16, code byte, v5 bool) []byte {
	h := kind << 4
	if kind == packets.Pubrel {
		h |= 0x02 // [MQTT-3.6.1-1]
	}
	if code == 0 || !v5 {
		return []byte{h, 2, byte(pid >> 8), byte(pid)}
	}
	return []byte{h, 3, byte(pid >> 8), byte(pid), code}
}

func packetName(t byte) string {
	if name, ok := packets.PacketNames[t]; ok {
		return name
	}
	return fmt.Sprintf("packet type %d", t)
}

func versionName(v byte) string {
	if v == 4 {
		return "MQTT 3.1.1"
	}
	return "MQTT 5"
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

// outPacket is one packet in the write queue.
type outPacket struct {
	b    []byte
	wait *ackWait          // the acknowledgement it asks for; its deadline starts when written
	sent func(error, byte) // a QoS 0 Publish's done, called once written
	last bool              // DISCONNECT: the connection closes once it is written
}

// writeQueue is the byte-bounded queue between the callers and the writer.
// push blocks while it is full; the bytes count until they are written.
type writeQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []outPacket
	bytes  int
	closed bool
}

func (q *writeQueue) init() { q.cond.L = &q.mu }

// push queues p, waiting for room unless force. It reports false once the
// queue is closed. A last packet closes the queue behind it.
func (q *writeQueue) push(p outPacket, force bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.closed && !force && q.bytes > 0 && q.bytes+len(p.b) > writeQueueBytes {
		q.cond.Wait()
	}
	return q.add(p)
}

// tryPush queues p only when the queue is empty.
func (q *writeQueue) tryPush(p outPacket) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes == 0 && q.add(p)
}

func (q *writeQueue) add(p outPacket) bool {
	if q.closed {
		return false
	}
	q.items = append(q.items, p)
	q.bytes += len(p.b)
	q.closed = p.last
	q.cond.Broadcast()
	return true
}

// take waits for packets and takes them all; false once the queue is
// closed and empty.
func (q *writeQueue) take() ([]outPacket, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	items := q.items
	q.items = nil
	return items, len(items) > 0
}

// release frees the bytes of written packets.
func (q *writeQueue) release(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (q *writeQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// drain takes what was never written, once the writer has stopped.
func (q *writeQueue) drain() []outPacket {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
