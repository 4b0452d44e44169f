package brokerbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// mqtt311 is the protocol level of MQTT 3.1.1 in CONNECT [MQTT-3.1.2-2]:
// every broker under test speaks it, and its packets carry no properties.
const mqtt311 = 4

// maxFiltersPerSubscribe bounds one SUBSCRIBE packet: 1,000 filters take ten
// round trips, and 100 filters of about 30 bytes stay far below any broker's
// maximum packet size.
const maxFiltersPerSubscribe = 100

// closeGrace is how long Close lets a writer blocked on a full socket (a
// broker that stopped reading) finish before the connection is torn down.
const closeGrace = 200 * time.Millisecond

// Errors returned by Dial and Subscribe; test with errors.Is.
var (
	ErrRefused    = errors.New("brokerbench: broker refused the connection")
	ErrSubRefused = errors.New("brokerbench: broker refused a subscription")
	ErrUnexpected = errors.New("brokerbench: unexpected packet")
)

// Packets the client sends unchanged: MQTT 3.1.1's PINGREQ and DISCONNECT
// are a fixed header with nothing after it.
var (
	pingreqPacket    = mqttwire.AppendHeader(nil, packets.Pingreq<<4, 0)
	disconnectPacket = mqttwire.AppendHeader(nil, packets.Disconnect<<4, 0)
)

// Options configures one connection.
type Options struct {
	ClientID    string
	Keepalive   time.Duration // sent in CONNECT; the caller pings (see keepAlive)
	ReadBuffer  int           // bytes; 0 means 4 KiB
	WriteBuffer int           // bytes; 0 means 4 KiB
	SendBuffer  int           // the socket's send buffer in bytes; 0 leaves it to the kernel
	Timeout     time.Duration // for the TCP dial, CONNACK and SUBACK; 0 means 5 s
	// Persistent asks for clean session 0, so that the broker keeps the
	// session, its subscriptions and the messages for it after the
	// connection closes [MQTT-3.1.2-4]. Such a connection closes normally
	// rather than with a reset, so that its DISCONNECT is not discarded.
	Persistent bool
}

// Conn is one MQTT 3.1.1 client connection, with a clean session unless
// Options.Persistent asked otherwise. One goroutine reads (Read, Subscribe, or a loop started by the scenario);
// any goroutine may write.
type Conn struct {
	nc      net.Conn
	r       *bufio.Reader
	rbuf    []byte // the body of the last packet read; Read's results alias it
	timeout time.Duration
	present bool // CONNACK's session present flag

	mu     sync.Mutex // guards w, enc and nextID
	w      *bufio.Writer
	enc    bytes.Buffer
	nextID uint16
}

// Dial connects to the broker at addr and completes the CONNECT/CONNACK
// exchange.
func Dial(ctx context.Context, addr string, o Options) (*Conn, error) {
	timeout := cmp.Or(o.Timeout, 5*time.Second)
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("brokerbench: %w", err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		// Close with a reset rather than leave TIME_WAIT behind: a full run
		// opens tens of thousands of connections, which would exhaust the
		// ephemeral ports between repetitions.
		if !o.Persistent {
			_ = tc.SetLinger(0)
		}
		if o.SendBuffer > 0 {
			_ = tc.SetWriteBuffer(o.SendBuffer)
		}
	}
	c := &Conn{
		nc:      nc,
		r:       bufio.NewReaderSize(nc, cmp.Or(o.ReadBuffer, 4<<10)),
		w:       bufio.NewWriterSize(nc, cmp.Or(o.WriteBuffer, 4<<10)),
		timeout: timeout,
	}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: mqtt311,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			Clean:            !o.Persistent,
			Keepalive:        uint16(o.Keepalive / time.Second),
			ClientIdentifier: o.ClientID,
		},
	}
	if err := c.send(&pk); err != nil {
		nc.Close()
		return nil, fmt.Errorf("brokerbench: %s: sending CONNECT: %w", addr, err)
	}
	_ = nc.SetReadDeadline(c.deadline(ctx))
	var ack packets.Packet
	if err := c.Read(&ack); err != nil {
		nc.Close()
		return nil, fmt.Errorf("brokerbench: %s: waiting for CONNACK: %w", addr, err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	switch {
	case ack.FixedHeader.Type != packets.Connack:
		nc.Close()
		return nil, fmt.Errorf("%w: packet type %d instead of CONNACK from %s", ErrUnexpected, ack.FixedHeader.Type, addr)
	case ack.ReasonCode != 0:
		nc.Close()
		return nil, fmt.Errorf("%w: %s answered CONNACK return code %d", ErrRefused, addr, ack.ReasonCode)
	}
	c.present = ack.SessionPresent
	return c, nil
}

// SessionPresent reports CONNACK's session present flag: whether the
// broker had a session for the client ID already [MQTT-3.2.2-2]. It is
// always false for a clean session.
func (c *Conn) SessionPresent() bool { return c.present }

// deadline is the earlier of the connection's timeout from now and ctx's deadline.
func (c *Conn) deadline(ctx context.Context) time.Time {
	t := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(t) {
		return d
	}
	return t
}

// Read reads the next packet into pk. Its topic, payload and SUBACK return
// codes alias the connection's buffer and are valid until the next Read.
func (c *Conn) Read(pk *packets.Packet) error {
	fh, body, err := mqttwire.ReadPacket(c.r, 0, c.rbuf)
	var bad *mqttwire.Error
	switch {
	case errors.As(err, &bad):
		return fmt.Errorf("brokerbench: %w", err)
	case err != nil:
		return err
	}
	c.rbuf = body
	*pk = packets.Packet{FixedHeader: fh, ProtocolVersion: mqtt311}
	switch fh.Type {
	case packets.Publish, packets.Puback, packets.Connack, packets.Suback:
		if err := mqttwire.Decode(pk, body); err != nil {
			return fmt.Errorf("brokerbench: %w", err)
		}
		return nil
	case packets.Pingresp:
		return nil
	default:
		return fmt.Errorf("%w: type %d", ErrUnexpected, fh.Type)
	}
}

// buffered reports whether more received bytes wait in the read buffer:
// a reader acknowledging messages flushes its PUBACKs only when none do.
func (c *Conn) buffered() bool { return c.r.Buffered() > 0 }

// Subscribe subscribes to filters at qos and waits for every SUBACK, failing
// if the broker refused any filter. It reads from the connection, so no
// other goroutine may be reading. Messages that arrive meanwhile (retained
// ones) go to onPublish when it is not nil.
func (c *Conn) Subscribe(ctx context.Context, filters []string, qos byte, onPublish func(*packets.Packet)) error {
	defer c.nc.SetReadDeadline(time.Time{})
	for start := 0; start < len(filters); start += maxFiltersPerSubscribe {
		batch := filters[start:min(start+maxFiltersPerSubscribe, len(filters))]
		_ = c.nc.SetReadDeadline(c.deadline(ctx))
		pk := packets.Packet{
			// mqttwire sets SUBSCRIBE's fixed header flags, 0010 [MQTT-3.8.1-1].
			FixedHeader:     packets.FixedHeader{Type: packets.Subscribe},
			ProtocolVersion: mqtt311,
			Filters:         make(packets.Subscriptions, len(batch)),
		}
		for i, f := range batch {
			pk.Filters[i] = packets.Subscription{Filter: f, Qos: qos}
		}
		c.mu.Lock()
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1 // [MQTT-2.3.1-1]: packet ids are non-zero
		}
		pk.PacketID = c.nextID
		c.mu.Unlock()
		if err := c.send(&pk); err != nil {
			return fmt.Errorf("brokerbench: SUBSCRIBE: %w", err)
		}
		if err := c.awaitSuback(pk.PacketID, batch, onPublish); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) awaitSuback(id uint16, filters []string, onPublish func(*packets.Packet)) error {
	var pk packets.Packet
	for {
		if err := c.Read(&pk); err != nil {
			return fmt.Errorf("brokerbench: waiting for SUBACK: %w", err)
		}
		switch pk.FixedHeader.Type {
		case packets.Publish:
			if onPublish != nil {
				onPublish(&pk)
			}
			if pk.FixedHeader.Qos > 0 {
				if err := c.puback(pk.PacketID, true); err != nil {
					return err
				}
			}
		case packets.Suback:
			if pk.PacketID != id {
				return fmt.Errorf("%w: SUBACK for packet id %d, want %d", ErrUnexpected, pk.PacketID, id)
			}
			if len(pk.ReasonCodes) != len(filters) {
				return fmt.Errorf("%w: SUBACK with %d return codes for %d filters", ErrUnexpected, len(pk.ReasonCodes), len(filters))
			}
			for i, code := range pk.ReasonCodes {
				if code >= 0x80 { // [MQTT-3.9.3]: 0x80 is failure
					return fmt.Errorf("%w: %q (return code %#02x)", ErrSubRefused, filters[i], code)
				}
			}
			return nil
		}
	}
}

// send encodes pk and writes and flushes it.
func (c *Conn) send(pk *packets.Packet) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enc.Reset()
	if err := mqttwire.EncodeTo(&c.enc, pk); err != nil {
		return err
	}
	if _, err := c.w.Write(c.enc.Bytes()); err != nil {
		return err
	}
	return c.w.Flush()
}

// write writes the encoded packet b, flushing when flush is set or the
// buffer is full.
func (c *Conn) write(b []byte, flush bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	if flush {
		return c.w.Flush()
	}
	return nil
}

// flush sends what write buffered.
func (c *Conn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Flush()
}

// puback acknowledges the QoS 1 message with packet id id.
func (c *Conn) puback(id uint16, flush bool) error {
	var b [4]byte
	return c.write(mqttwire.AppendAck(b[:0], packets.Puback, id, 0, false, ""), flush)
}

// Ping sends PINGREQ; the PINGRESP is read, or left in the socket buffer,
// by whoever reads the connection.
func (c *Conn) Ping() error { return c.write(pingreqPacket, true) }

// Close sends DISCONNECT and closes the connection. A writer blocked on a
// broker that stopped reading gets closeGrace to finish first.
func (c *Conn) Close() error { return c.closeBy(time.Now().Add(closeGrace)) }

// closeBy is Close with the writers' deadline given, so that many
// connections closed in a row share one grace period.
func (c *Conn) closeBy(deadline time.Time) error {
	_ = c.nc.SetWriteDeadline(deadline)
	c.mu.Lock()
	if _, err := c.w.Write(disconnectPacket); err == nil {
		_ = c.w.Flush()
	}
	c.mu.Unlock()
	return c.nc.Close()
}

// publishPacket is one PUBLISH encoded once; its packet id and payload are
// patched in place for every message, so publishing allocates nothing.
type publishPacket struct {
	b         []byte
	idAt      int // offset of the packet id; unused at QoS 0
	payloadAt int
}

func newPublishPacket(topic string, qos byte, payloadSize int) (*publishPacket, error) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: qos},
		ProtocolVersion: mqtt311,
		TopicName:       topic,
		Payload:         make([]byte, payloadSize),
	}
	for i := range pk.Payload {
		pk.Payload[i] = 'a' + byte(i%26)
	}
	if qos > 0 {
		pk.PacketID = 1 // a placeholder, patched per message
	}
	b, err := mqttwire.Encode(&pk)
	if err != nil {
		return nil, fmt.Errorf("brokerbench: encoding PUBLISH to %s: %w", topic, err)
	}
	p := &publishPacket{b: b}
	p.payloadAt = len(p.b) - payloadSize
	p.idAt = p.payloadAt - 2
	return p, nil
}

func (p *publishPacket) setID(id uint16) { binary.BigEndian.PutUint16(p.b[p.idAt:], id) }

func (p *publishPacket) payload() []byte { return p.b[p.payloadAt:] }

// Probe reports whether a broker answers CONNACK at addr within timeout,
// retrying while it starts. The error says what went wrong last.
func Probe(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := Dial(ctx, addr, Options{
			ClientID:  fmt.Sprintf("probe%d", time.Now().UnixNano()%1e9),
			Keepalive: time.Minute, // some brokers warn about none
			Timeout:   timeout,
		})
		if err == nil {
			return c.Close()
		}
		if errors.Is(err, ErrRefused) {
			return err // the broker is up and said no; retrying will not change that
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no CONNACK from %s within %v: %w", addr, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
