package reliability

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// client is a minimal MQTT 5 client on one TCP connection. The test keeps
// its own session state (packet identifiers, QoS 2 stages) outside it, as a
// device's firmware would, so that it survives the connection: a client
// library would hide the DUP flag and the identifiers, and could not be
// trusted to resend exactly what the protocol asks after a broker restart.
// mqttwire frames, encodes and decodes the packets.
type client struct {
	id  string
	nc  net.Conn
	r   *bufio.Reader
	wmu sync.Mutex // one writer at a time: a reader goroutine answers too
}

// ioTimeout bounds every write and every wait for an answer that must
// come: long for loopback, so that only a broker that is gone or stuck
// reaches it.
var ioTimeout = testkit.Scale(10 * time.Second)

// sessionExpiry is what persistent clients ask for, in seconds: a day,
// far longer than any run.
const sessionExpiry = 24 * 60 * 60

// errRefused is a CONNACK, SUBACK or acknowledgement with a failure code.
var errRefused = errors.New("refused by the broker")

// refusal is a CONNACK or SUBACK with a failure code; it is errRefused.
type refusal struct {
	what   string // "alice: CONNACK", "bob: SUBACK for devices/#"
	code   byte
	reason string
}

func (e *refusal) Error() string {
	return fmt.Sprintf("%s 0x%02x %q: %v", e.what, e.code, e.reason, errRefused)
}

func (e *refusal) Unwrap() error { return errRefused }

// refusedCode returns the reason code of a CONNACK or SUBACK refusal, and
// false for any other error.
func refusedCode(err error) (byte, bool) {
	var r *refusal
	if errors.As(err, &r) {
		return r.code, true
	}
	return 0, false
}

// dial connects and sends CONNECT. clean is Clean Start; expiry is the
// Session Expiry Interval in seconds (0: the session ends with the
// connection); receiveMax 0 leaves the Receive Maximum at the broker's
// choice. It returns the CONNACK's Session Present flag.
func dial(addr, id string, clean bool, expiry uint32, receiveMax uint16) (*client, bool, error) {
	return dialAs(addr, id, "", "", clean, expiry, receiveMax)
}

// dialAs is dial with a user name and password; an empty user sends
// neither.
func dialAs(addr, id, user, password string, clean bool, expiry uint32, receiveMax uint16) (*client, bool, error) {
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		return nil, false, err
	}
	c := &client{id: id, nc: nc, r: bufio.NewReaderSize(nc, 16<<10)}
	pk := &packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: id,
			Clean:            clean,
			Keepalive:        60,
		},
	}
	if expiry > 0 {
		pk.Properties.SessionExpiryInterval = expiry
		pk.Properties.SessionExpiryIntervalFlag = true
	}
	pk.Properties.ReceiveMaximum = receiveMax
	if user != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(user)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(password)
	}
	if err := c.write(pk); err != nil {
		c.close()
		return nil, false, err
	}
	ack, err := c.read(ioTimeout)
	if err != nil {
		c.close()
		return nil, false, fmt.Errorf("%s: waiting for CONNACK: %w", id, err)
	}
	if ack.FixedHeader.Type != packets.Connack {
		c.close()
		return nil, false, fmt.Errorf("%s: %s instead of CONNACK", id, packetName(ack))
	}
	if ack.ReasonCode != 0 {
		c.close()
		return nil, false, &refusal{what: id + ": CONNACK", code: ack.ReasonCode, reason: ack.Properties.ReasonString}
	}
	return c, ack.SessionPresent, nil
}

func (c *client) close() { _ = c.nc.Close() }

// write encodes pk, with the header flags PUBREL and SUBSCRIBE must carry
// [MQTT-3.6.1-1] [MQTT-3.8.1-1], and sends it.
func (c *client) write(pk *packets.Packet) error {
	pk.ProtocolVersion = 5
	b, err := mqttwire.Encode(pk)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
	_, err = c.nc.Write(b)
	return err
}

// read returns the next packet, waiting at most wait for it to start
// arriving. Only one goroutine reads.
func (c *client) read(wait time.Duration) (*packets.Packet, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(wait))
	hb, err := c.r.ReadByte()
	if err != nil {
		return nil, err
	}
	// The rest of a packet that has started comes at loopback speed.
	_ = c.nc.SetReadDeadline(time.Now().Add(ioTimeout))
	fh, _, err := mqttwire.ReadHeader(hb, c.r, 0)
	if err != nil {
		return nil, fmt.Errorf("from the broker: %w", err)
	}
	body, err := mqttwire.ReadBody(c.r, fh.Remaining, nil)
	if err != nil {
		return nil, err
	}
	return decodeFromBroker(fh, body)
}

// decodeFromBroker decodes a packet the broker sent, which must be one
// servers send.
func decodeFromBroker(fh packets.FixedHeader, body []byte) (*packets.Packet, error) {
	pk := &packets.Packet{FixedHeader: fh, ProtocolVersion: 5}
	if !mqttwire.SentByServer(fh.Type) {
		return nil, fmt.Errorf("unexpected %s from the broker", packetName(pk))
	}
	if err := mqttwire.Decode(pk, body); err != nil {
		return nil, fmt.Errorf("from the broker: %w", err)
	}
	return pk, nil
}

// publish sends a PUBLISH; dup marks a resend [MQTT-3.3.1-1].
func (c *client) publish(topic, payload string, qos byte, pid uint16, dup bool) error {
	return c.write(&packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Dup: dup},
		TopicName:   topic,
		Payload:     []byte(payload),
		PacketID:    pid,
	})
}

// ack sends a PUBACK, PUBREC, PUBREL or PUBCOMP with reason code 0.
func (c *client) ack(kind byte, pid uint16) error {
	return c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: kind}, PacketID: pid})
}

// subscribe subscribes to one filter and waits for the SUBACK, which must
// grant qos.
func (c *client) subscribe(filter string, qos byte) error {
	err := c.write(&packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe},
		PacketID:    1,
		Filters:     packets.Subscriptions{{Filter: filter, Qos: qos}},
	})
	if err != nil {
		return err
	}
	for {
		pk, err := c.read(ioTimeout)
		if err != nil {
			return fmt.Errorf("%s: waiting for SUBACK: %w", c.id, err)
		}
		if pk.FixedHeader.Type != packets.Suback {
			continue // a message for an earlier subscription
		}
		if len(pk.ReasonCodes) != 1 || pk.ReasonCodes[0] != qos {
			code := byte(0)
			if len(pk.ReasonCodes) > 0 {
				code = pk.ReasonCodes[0]
			}
			return &refusal{what: fmt.Sprintf("%s: SUBACK for %s at QoS %d", c.id, filter, qos), code: code}
		}
		return nil
	}
}

// disconnect ends the connection normally, keeping the session.
func (c *client) disconnect() {
	_ = c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	c.close()
}

// packetName names pk's type, for messages.
func packetName(pk *packets.Packet) string { return mqttwire.PacketName(pk.FixedHeader.Type) }
