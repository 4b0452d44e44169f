package mqttclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// Dial connects to the server, sends CONNECT and waits for CONNACK. A
// refusal returns an error wrapping a *RefusedError (and ErrRefused). With
// Protocol 0 it first tries MQTT 5 and falls back to 3.1.1 when the server
// refuses 5: a CONNACK with reason 0x84, a 3.1.1 CONNACK with return code
// 1, or the connection closed in answer to the CONNECT.
func Dial(ctx context.Context, o Options) (*Client, error) {
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

// dialVersion makes one connection attempt with protocol version v.
// fallback reports a refusal of MQTT 5 that 3.1.1 may get past.
func dialVersion(ctx context.Context, o Options, v byte) (c *Client, fallback bool, err error) {
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
		return nil, false, fmt.Errorf("server sent %s before CONNACK", strings.ToUpper(mqttwire.PacketName(fh.Type)))
	}
	if v == 5 && len(body) >= 2 && body[1] == packets.Err3UnsupportedProtocolVersion.Code {
		// A 3.1.1 server's return code 1, "unacceptable protocol
		// version"; no MQTT 5 CONNACK uses 0x01 (§3.2.2.2).
		return nil, true, &RefusedError{Version: 4, Code: packets.Err3UnsupportedProtocolVersion.Code}
	}
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: v}
	if err := mqttwire.Decode(&pk, body); err != nil {
		return nil, false, err
	}
	if pk.ReasonCode != 0 {
		if v == 5 && pk.ReasonCode < 0x80 {
			return nil, false, fmt.Errorf("CONNACK with reason 0x%02X, which is not a CONNACK code", pk.ReasonCode)
		}
		re := &RefusedError{Version: v, Code: pk.ReasonCode, Reason: pk.Properties.ReasonString, ServerReference: pk.Properties.ServerReference}
		return nil, v == 5 && pk.ReasonCode == packets.ErrUnsupportedProtocolVersion.Code, re
	}
	return newClient(o, nc, br, v, &pk), false, nil
}

// connectOnce writes CONNECT and reads the first packet back through br,
// which the connection goes on reading with: the server may send more
// right behind CONNACK.
func connectOnce(nc net.Conn, br *bufio.Reader, o Options, v byte) (packets.FixedHeader, []byte, error) {
	if _, err := nc.Write(connectPacket(o, v)); err != nil {
		return packets.FixedHeader{}, nil, fmt.Errorf("write CONNECT: %w", err)
	}
	fh, body, err := mqttwire.ReadPacket(br, 0, nil)
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

func connectPacket(o Options, v byte) []byte {
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
	return encode(&pk)
}

func newClient(o Options, nc net.Conn, br *bufio.Reader, v byte, ack *packets.Packet) *Client {
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
	c.info = Info{Version: v, SessionPresent: ack.SessionPresent, ReceiveMaximum: mqttwire.MaxTwoByte, MaxQoS: 2, RetainAvailable: true}
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
