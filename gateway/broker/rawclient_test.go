package broker

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// rawClient is an MQTT client that sends exactly the packets a test builds
// and hands back every packet the broker sends, decoded but unanswered. It
// is for what client libraries hide: DUP flags, packet identifiers, exact
// reason codes, acknowledgements held back, packets that must not come.
// It speaks MQTT 3.1.1 (version 4) and 5.0 (version 5); mqttwire frames,
// encodes and decodes the packets.
//
// A goroutine reads the socket from the start, so a packet the broker sends
// is never lost to a test that was not yet waiting, and every wait is
// bounded by wait.
type rawClient struct {
	t       testing.TB
	version byte
	nc      net.Conn
	wait    time.Duration // how long expect and friends wait; rawWait unless a test changes it

	in     chan rawEvent
	stop   chan struct{}
	done   chan struct{}
	ended  error     // why the connection ended, once a receive has seen it
	lastAt time.Time // when the last packet or end a receive returned was read
	once   sync.Once
}

// rawEvent is one packet from the broker, or why there are no more, and
// when it was read.
type rawEvent struct {
	pk  *packets.Packet
	err error
	at  time.Time
}

// rawWait bounds every wait for a packet that should come: long enough
// for a loaded machine running the race detector, short enough that a
// broker that never answers fails the test quickly.
var rawWait = testkit.Scale(3 * time.Second)

// rawQuiet is how long a test watches for a packet that must not come.
const rawQuiet = 300 * time.Millisecond

// errRawTimeout reports a wait that ended with nothing received.
var errRawTimeout = errors.New("nothing received in time")

// rawMalformed reports bytes from the broker that do not decode: a broker
// bug, never a normal end of the connection.
type rawMalformed struct{ err error }

func (e *rawMalformed) Error() string { return "malformed packet from the broker: " + e.err.Error() }

// dialRaw opens a connection to addr for an MQTT client of the given
// version (4 or 5). It sends nothing; the connection closes with the test.
func dialRaw(t testing.TB, addr string, version byte) *rawClient {
	t.Helper()
	if version != 4 && version != 5 {
		t.Fatalf("dialRaw: protocol version %d; use 4 (3.1.1) or 5", version)
	}
	nc, err := net.DialTimeout("tcp", addr, rawWait)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &rawClient{
		t:       t,
		version: version,
		nc:      nc,
		wait:    rawWait,
		in:      make(chan rawEvent, 1024),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	t.Cleanup(c.close)
	return c
}

// connectRaw dials addr and connects as clientID; edit, when not nil,
// changes the CONNECT first. It fails the test unless the broker accepts
// the connection, and returns the client and its CONNACK.
func connectRaw(t testing.TB, addr string, version byte, clientID string, clean bool, edit func(*packets.Packet)) (*rawClient, *packets.Packet) {
	t.Helper()
	c := dialRaw(t, addr, version)
	pk := c.connectPacket(clientID, clean)
	if edit != nil {
		edit(pk)
	}
	ack := c.connect(pk)
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNECT %q refused: %s", clientID, rawDescribe(ack))
	}
	return c, ack
}

// close ends the connection without a DISCONNECT, as a network failure
// would, and waits for the reader to stop. It is safe to call twice.
func (c *rawClient) close() {
	c.once.Do(func() {
		close(c.stop)
		_ = c.nc.Close()
		<-c.done
	})
}

func (c *rawClient) readLoop() {
	defer close(c.done)
	r := bufio.NewReader(c.nc)
	for {
		pk, err := readRawPacket(r, c.version)
		select {
		case c.in <- rawEvent{pk, err, time.Now()}:
		case <-c.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// readRawPacket reads one packet through mqttwire's reader and decodes
// it: a packet that breaks the framing, is not one servers send, or does
// not decode is a *rawMalformed; the connection's own errors pass as they
// are.
func readRawPacket(r *bufio.Reader, version byte) (*packets.Packet, error) {
	fh, body, err := mqttwire.ReadPacket(r, 0, nil)
	var bad *mqttwire.Error
	switch {
	case errors.As(err, &bad):
		return nil, &rawMalformed{err}
	case err != nil:
		return nil, err
	}
	if !mqttwire.SentByServer(fh.Type) {
		return nil, &rawMalformed{fmt.Errorf("%s is not a packet servers send", mqttwire.PacketName(fh.Type))}
	}
	pk := &packets.Packet{FixedHeader: fh, ProtocolVersion: version}
	if err := mqttwire.Decode(pk, body); err != nil {
		return nil, &rawMalformed{err}
	}
	return pk, nil
}

// encode returns pk's bytes in the client's protocol version; mqttwire
// gives PUBREL, SUBSCRIBE and UNSUBSCRIBE their required header flags
// [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1]; send bytes by hand to
// break those rules.
func (c *rawClient) encode(pk *packets.Packet) []byte {
	c.t.Helper()
	pk.ProtocolVersion = c.version
	// Let the codec write response topics and correlation data, which
	// it otherwise leaves out of PUBLISH and will properties.
	pk.Mods.AllowResponseInfo = true
	b, err := mqttwire.Encode(pk)
	if err != nil {
		c.t.Fatalf("rawClient: encode %s: %v", mqttwire.PacketName(pk.FixedHeader.Type), err)
	}
	return b
}

// send writes packets, failing the test if the socket refuses them.
func (c *rawClient) send(pks ...*packets.Packet) {
	c.t.Helper()
	for _, pk := range pks {
		c.sendBytes(c.encode(pk))
	}
}

// sendBytes writes b as it is.
func (c *rawClient) sendBytes(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.wait))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("rawClient: write: %v", err)
	}
}

// recv returns the next packet, waiting at most wait; the error is
// errRawTimeout, why the connection ended, or a *rawMalformed.
func (c *rawClient) recv(wait time.Duration) (*packets.Packet, error) {
	if c.ended != nil {
		return nil, c.ended
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case ev := <-c.in:
		c.lastAt = ev.at
		if ev.err != nil {
			c.ended = ev.err
			return nil, ev.err
		}
		return ev.pk, nil
	case <-timer.C:
		return nil, errRawTimeout
	}
}

// expect returns the next packet, failing the test unless it is of type
// kind.
func (c *rawClient) expect(kind byte) *packets.Packet {
	c.t.Helper()
	pk, err := c.recv(c.wait)
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", mqttwire.PacketName(kind), err)
	}
	if pk.FixedHeader.Type != kind {
		c.t.Fatalf("got %s, want %s", rawDescribe(pk), mqttwire.PacketName(kind))
	}
	return pk
}

// expectAck returns the next packet, failing the test unless it is of type
// kind for packet identifier pid with reason code code.
func (c *rawClient) expectAck(kind byte, pid uint16, code byte) *packets.Packet {
	c.t.Helper()
	pk := c.expect(kind)
	if pk.PacketID != pid || pk.ReasonCode != code {
		c.t.Fatalf("got %s, want %s id %d reason 0x%02X", rawDescribe(pk), mqttwire.PacketName(kind), pid, code)
	}
	return pk
}

// expectPublish returns the next packet, failing the test unless it is a
// PUBLISH of payload to topic at QoS qos.
func (c *rawClient) expectPublish(topic, payload string, qos byte) *packets.Packet {
	c.t.Helper()
	pk := c.expect(packets.Publish)
	if pk.TopicName != topic || string(pk.Payload) != payload || pk.FixedHeader.Qos != qos {
		c.t.Fatalf("got %s, want PUBLISH %q %q QoS %d", rawDescribe(pk), topic, payload, qos)
	}
	return pk
}

// expectNone fails the test if a packet arrives, or the connection ends,
// within wait.
func (c *rawClient) expectNone(wait time.Duration) {
	c.t.Helper()
	pk, err := c.recv(wait)
	switch {
	case err == nil:
		c.t.Fatalf("got %s, want nothing", rawDescribe(pk))
	case !errors.Is(err, errRawTimeout):
		c.t.Fatalf("want the connection open and quiet: %v", err)
	}
}

// untilPong sends PINGREQ and returns the packets that arrive before
// PINGRESP. The broker answers a connection's packets in order and
// acknowledges a publish only once it has routed it, so these are all it
// routed to this client before reading the PINGREQ: a publish another
// client has had acknowledged, say, or the retained messages of a
// subscription whose SUBACK came. It waits for no timer, so tests use it
// rather than expectNone unless a delay is what they test.
func (c *rawClient) untilPong() []*packets.Packet {
	c.t.Helper()
	c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	var got []*packets.Packet
	for {
		pk, err := c.recv(c.wait)
		if err != nil {
			c.t.Fatalf("waiting for PINGRESP: %v", err)
		}
		if pk.FixedHeader.Type == packets.Pingresp {
			return got
		}
		got = append(got, pk)
	}
}

// quiet fails the test if the broker has anything on its way to the
// client (see untilPong).
func (c *rawClient) quiet() {
	c.t.Helper()
	if got := c.untilPong(); len(got) > 0 {
		c.t.Fatalf("got %s, want nothing before PINGRESP", rawDescribe(got[0]))
	}
}

// expectClosed fails the test unless the broker closes the connection
// without sending anything more.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	pk, err := c.recv(c.wait)
	var bad *rawMalformed
	switch {
	case err == nil:
		c.t.Fatalf("got %s, want the connection closed", rawDescribe(pk))
	case errors.Is(err, errRawTimeout):
		c.t.Fatalf("connection still open after %v, want it closed", c.wait)
	case errors.As(err, &bad):
		c.t.Fatal(err)
	}
}

// expectDisconnect fails the test unless the broker sends DISCONNECT with
// code and then closes the connection; it returns the DISCONNECT.
func (c *rawClient) expectDisconnect(code byte) *packets.Packet {
	c.t.Helper()
	pk := c.expect(packets.Disconnect)
	if pk.ReasonCode != code {
		c.t.Fatalf("got %s, want reason 0x%02X", rawDescribe(pk), code)
	}
	if pk.Properties.SessionExpiryIntervalFlag {
		c.t.Errorf("server DISCONNECT carries a session expiry interval [MQTT-3.14.2-2]")
	}
	c.expectClosed() // [MQTT-3.14.4-1] [MQTT-3.14.4-2]
	return pk
}

// connectPacket returns a CONNECT for clientID in the client's version,
// keep alive off; tests set further fields before sending it.
func (c *rawClient) connectPacket(clientID string, clean bool) *packets.Packet {
	return &packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: clientID,
			Clean:            clean,
		},
	}
}

// connect sends CONNECT and returns the CONNACK, whatever its code.
func (c *rawClient) connect(pk *packets.Packet) *packets.Packet {
	c.t.Helper()
	c.send(pk)
	return c.expect(packets.Connack)
}

// subscribe sends SUBSCRIBE with identifier pid and returns the SUBACK's
// reason codes, one per subscription.
func (c *rawClient) subscribe(pid uint16, subs ...packets.Subscription) []byte {
	c.t.Helper()
	return c.subscribePacket(rawSubscribe(pid, subs...))
}

// subscribePacket sends a SUBSCRIBE the test built (with a subscription
// identifier, say) and returns the SUBACK's reason codes.
func (c *rawClient) subscribePacket(pk *packets.Packet) []byte {
	c.t.Helper()
	c.send(pk)
	ack := c.expect(packets.Suback)
	if ack.PacketID != pk.PacketID {
		c.t.Fatalf("got %s, want SUBACK id %d [MQTT-3.8.4-2]", rawDescribe(ack), pk.PacketID)
	}
	if len(ack.ReasonCodes) != len(pk.Filters) {
		c.t.Fatalf("got %s for %d filters [MQTT-3.8.4-6]", rawDescribe(ack), len(pk.Filters))
	}
	return slices.Clone(ack.ReasonCodes)
}

// publish sends a PUBLISH and, for QoS 1 and 2, completes its flow:
// PUBACK, or PUBREC, PUBREL and PUBCOMP, each with reason code 0.
// Another client must receive what it routes: this one's own
// subscriptions would put deliveries among the acknowledgements.
func (c *rawClient) publish(pk *packets.Packet) {
	c.t.Helper()
	c.send(pk)
	switch pk.FixedHeader.Qos {
	case 1:
		c.expectAck(packets.Puback, pk.PacketID, 0)
	case 2:
		c.expectAck(packets.Pubrec, pk.PacketID, 0)
		c.send(rawAck(packets.Pubrel, pk.PacketID, 0))
		c.expectAck(packets.Pubcomp, pk.PacketID, 0)
	}
}

// ackPublish answers a PUBLISH received at QoS 1 or 2 and completes its
// flow: PUBACK, or PUBREC, PUBREL and PUBCOMP. With QoS 2, nothing else may
// be on its way to the client meanwhile.
func (c *rawClient) ackPublish(pk *packets.Packet) {
	c.t.Helper()
	switch pk.FixedHeader.Qos {
	case 1:
		c.send(rawAck(packets.Puback, pk.PacketID, 0))
	case 2:
		c.send(rawAck(packets.Pubrec, pk.PacketID, 0))
		c.expectAck(packets.Pubrel, pk.PacketID, 0)
		c.send(rawAck(packets.Pubcomp, pk.PacketID, 0))
	}
}

// ping sends PINGREQ and waits for PINGRESP.
func (c *rawClient) ping() {
	c.t.Helper()
	c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	c.expect(packets.Pingresp)
}

// disconnect sends DISCONNECT with reason code (MQTT 5; 3.1.1 has none)
// and waits for the broker to close the connection.
func (c *rawClient) disconnect(code byte) {
	c.t.Helper()
	c.send(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ReasonCode: code})
	c.expectClosed()
}

// rawSubscribe builds a SUBSCRIBE.
func rawSubscribe(pid uint16, subs ...packets.Subscription) *packets.Packet {
	return &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: pid, Filters: subs}
}

// rawUnsubscribe builds an UNSUBSCRIBE.
func rawUnsubscribe(pid uint16, filters ...string) *packets.Packet {
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, PacketID: pid}
	for _, f := range filters {
		pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
	}
	return pk
}

// rawPublish builds a PUBLISH; pid is ignored at QoS 0.
func rawPublish(topic, payload string, qos byte, retain bool, pid uint16) *packets.Packet {
	pk := &packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
		TopicName:   topic,
		Payload:     []byte(payload),
	}
	if qos > 0 {
		pk.PacketID = pid
	}
	return pk
}

// rawAck builds a PUBACK, PUBREC, PUBREL or PUBCOMP.
func rawAck(kind byte, pid uint16, code byte) *packets.Packet {
	return &packets.Packet{FixedHeader: packets.FixedHeader{Type: kind}, PacketID: pid, ReasonCode: code}
}

// rawDescribe formats a packet for failure messages.
func rawDescribe(pk *packets.Packet) string {
	var b strings.Builder
	b.WriteString(strings.ToUpper(mqttwire.PacketName(pk.FixedHeader.Type)))
	switch pk.FixedHeader.Type {
	case packets.Publish:
		payload := string(pk.Payload)
		if len(payload) > 40 {
			payload = payload[:40] + "…"
		}
		fmt.Fprintf(&b, " topic=%q qos=%d dup=%t retain=%t id=%d payload=%q", pk.TopicName, pk.FixedHeader.Qos, pk.FixedHeader.Dup, pk.FixedHeader.Retain, pk.PacketID, payload)
		if p := &pk.Properties; p.TopicAliasFlag || len(p.SubscriptionIdentifier) > 0 || p.MessageExpiryInterval > 0 {
			fmt.Fprintf(&b, " alias=%d subids=%v expiry=%d", p.TopicAlias, p.SubscriptionIdentifier, p.MessageExpiryInterval)
		}
	case packets.Connack:
		fmt.Fprintf(&b, " reason=0x%02X present=%t", pk.ReasonCode, pk.SessionPresent)
	case packets.Suback, packets.Unsuback:
		fmt.Fprintf(&b, " id=%d reasons=% X", pk.PacketID, pk.ReasonCodes)
	case packets.Disconnect, packets.Auth:
		fmt.Fprintf(&b, " reason=0x%02X", pk.ReasonCode)
	case packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp:
		fmt.Fprintf(&b, " id=%d reason=0x%02X", pk.PacketID, pk.ReasonCode)
	}
	if pk.Properties.ReasonString != "" {
		fmt.Fprintf(&b, " reason-string=%q", pk.Properties.ReasonString)
	}
	return b.String()
}
