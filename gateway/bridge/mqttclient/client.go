package mqttclient

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
)

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

// Client is one connection to the upstream broker. Its methods are safe
// for concurrent use.
type Client struct {
	o         Options
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
	pings         []pingWait // the PINGREQs in flight, in the order sent
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

// pingWait is a PINGREQ awaiting its PINGRESP: the watchdog's, or one
// that Ping waits for on got.
type pingWait struct {
	wait *ackWait
	got  chan struct{} // closed on the PINGRESP; nil for the watchdog's
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
	b := encode(&pk)
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

// Release resends PUBREL for pid, a QoS 2 message that had its PUBREC
// before a reconnect with a session present (its done error matched
// ErrReleasePending); done is called as for Publish, on PUBCOMP. A pid
// taken by Claim is used and given up.
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
	if _, ok := c.reserved[pid]; ok {
		delete(c.reserved, pid) // claimed: its place in the window was taken with it
	} else if len(c.flights)+len(c.reserved) >= c.window {
		c.mu.Unlock()
		return ErrWindowFull
	} else if c.inUseLocked(pid) {
		c.mu.Unlock()
		return fmt.Errorf("bridge: release: packet id %d is still in flight", pid)
	}
	f := &flight{qos: 2, rel: true, done: done, wait: &ackWait{kind: packets.Pubcomp, pid: pid}}
	c.flights[pid] = f
	c.mu.Unlock()
	_, err := c.sendFlight(pid, f, mqttwire.Ack(packets.Pubrel, pid, 0, c.v5, ""))
	return err
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
	if !c.q.push(outPacket{b: mqttwire.Ack(packets.Pubrel, pid, 0, c.v5, ""), wait: f.wait}, false) {
		return c.endErr()
	}
	return nil
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
		if s.ID < 0 || s.ID > mqttwire.MaxSubscriptionID {
			errs = append(errs, fmt.Errorf("filter %q: subscription identifier %d, want 1 to %d or 0 for none", s.Filter, s.ID, mqttwire.MaxSubscriptionID))
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
		return encode(&pk)
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
		return encode(&pk)
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
			errs = append(errs, fmt.Errorf("filter %q: %s (0x%02X)", filters[i], mqttwire.ReasonName(code), code))
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

// Ping sends PINGREQ and waits for its PINGRESP: a round trip that shows
// the server reads this connection and answers on it. It returns the
// connection's error if the connection ends first, which it does when the
// answer is later than AckTimeout, or ctx's when ctx ends first.
func (c *Client) Ping(ctx context.Context) error {
	pw := pingWait{wait: &ackWait{kind: packets.Pingresp}, got: make(chan struct{})}
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	c.pings = append(c.pings, pw)
	c.mu.Unlock()
	if !c.q.push(outPacket{b: pingreq, wait: pw.wait}, false) {
		return c.endErr()
	}
	select {
	case <-pw.got:
		return nil
	case <-c.stop:
		return c.endErr()
	case <-ctx.Done():
		return fmt.Errorf("bridge: no PINGRESP: %w", ctx.Err())
	}
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
