package broker

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/mochi-mqtt/server/v2/packets"
)

// connectTimeout bounds the wait for CONNECT after a socket opens
// (a TLS handshake included), so that idle sockets cannot pile up.
const connectTimeout = 10 * time.Second

// serve is the reader goroutine: CONNECT, then the packet loop, then the
// end of the connection (will, session) however it came.
func (c *conn) serve() {
	defer c.nc.Close()
	defer c.releaseReader()
	_ = c.nc.SetReadDeadline(time.Now().Add(connectTimeout))
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			c.b.log.Debug("tls handshake failed", "remote", c.remote, "err", err)
			return
		}
	}
	if !c.connect() {
		return
	}
	err := c.loop()
	c.end(err)
	<-c.done
}

// loop reads and handles packets until the connection fails or ends.
func (c *conn) loop() error {
	// The Maximum Packet Size we announce [MQTT-3.1.2-24].
	maxSize := c.b.opts.MaxPacketSize
	for {
		if c.keepalive > 0 {
			// [MQTT-3.1.2-22]: one and a half keep alive periods.
			_ = c.nc.SetReadDeadline(time.Now().Add(c.keepalive * 3 / 2))
		} else {
			_ = c.nc.SetReadDeadline(time.Time{})
		}
		fh, body, err := c.readPacket(maxSize)
		if err != nil {
			return err
		}
		if err := c.handle(fh, body); err != nil {
			return err
		}
	}
}

// handle dispatches one packet after CONNECT.
func (c *conn) handle(fh packets.FixedHeader, body []byte) error {
	// Packets are large and nothing keeps one past its handler (messages
	// copy what they keep), so they are pooled rather than allocated.
	pk := packetPool.Get().(*packets.Packet)
	defer packetPool.Put(pk)
	*pk = packets.Packet{FixedHeader: fh, ProtocolVersion: 4}
	if c.v5 {
		pk.ProtocolVersion = 5
	}
	switch fh.Type {
	case packets.Publish:
		if err := decode(pk, body); err != nil {
			return err
		}
		return c.onPublish(pk)
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		if err := decode(pk, body); err != nil {
			return err
		}
		failed := pk.ReasonCode >= 0x80
		fx := &effects{}
		if !c.s.ack(fh.Type, pk.PacketID, failed, fx) {
			// An ack for nothing we sent: harmless after a takeover or
			// a discard, so it is ignored rather than fatal.
			if fh.Type == packets.Pubrec {
				// Answer with PUBREL 0x92 so that the client can free
				// the identifier.
				c.enqueueControl(mqttwire.Ack(packets.Pubrel, pk.PacketID, rcPacketIDNotFound, c.v5, ""))
			}
			return nil
		}
		c.s.pumpRetained() // the window has room again
		if fh.Type == packets.Pubrec && !failed {
			// After the PUBREC is on disk. Should the commit fail, PUBREL
			// goes all the same: the flight is past PUBREC in memory, and
			// holding PUBREL back would only stall the client.
			pid := pk.PacketID
			c.ackAfter(fx, func(error) []byte { return pubrelPacket(pid, c.v5) }) // [MQTT-4.3.3-4]
		}
		return nil
	case packets.Pubrel:
		if err := decode(pk, body); err != nil {
			return err
		}
		pid := pk.PacketID
		fx := &effects{}
		c.s.mu.Lock()
		_, ok := c.s.awaitingRel[pid]
		delete(c.s.awaitingRel, pid)
		if ok && c.s.persistent(c.b) {
			// Gone from disk before PUBCOMP: afterwards the identifier
			// may carry a new message.
			fx.batch.DeleteAwaitingRel(c.clientID, pid)
		}
		c.s.mu.Unlock()
		code := byte(rcSuccess)
		if !ok {
			code = rcPacketIDNotFound
		}
		c.ackAfter(fx, func(error) []byte { return mqttwire.Ack(packets.Pubcomp, pid, code, c.v5, "") }) // [MQTT-4.3.3-11]
		return nil
	case packets.Subscribe:
		if err := checkSubscribeOptions(body, c.v5); err != nil {
			return err
		}
		if err := decode(pk, body); err != nil {
			return err
		}
		return c.onSubscribe(pk)
	case packets.Unsubscribe:
		if err := decode(pk, body); err != nil {
			return err
		}
		return c.onUnsubscribe(pk)
	case packets.Pingreq:
		if len(body) != 0 {
			return failure(rcMalformed, "PINGREQ with a body")
		}
		c.enqueueControl(pingresp)
		return nil
	case packets.Disconnect:
		// The codec skips a lone reason code; read it here.
		if c.v5 && len(body) > 0 {
			pk.ReasonCode = body[0]
			if len(body) > 1 {
				// The codec also skips a property length that is the
				// last byte; checkBody (under decode) requires the
				// properties to fill the rest exactly.
				if err := decode(pk, body); err != nil {
					return err
				}
			}
		} else if len(body) > 0 {
			return failure(rcMalformed, "DISCONNECT with a body")
		}
		return c.onDisconnect(pk)
	case packets.Connect:
		return failure(rcProtocolError, "second CONNECT") // [MQTT-3.1.0-2]
	case packets.Auth:
		// No authentication method was accepted at CONNECT, so AUTH is
		// a protocol error [MQTT-4.12.0-1].
		return failure(rcProtocolError, "AUTH without an authentication method")
	default:
		return failure(rcProtocolError, "%s is not sent by clients", mqttwire.PacketName(fh.Type))
	}
}

var packetPool = sync.Pool{New: func() any { return new(packets.Packet) }}

var pingresp = []byte{packets.Pingresp << 4, 0}

// onPublish handles a client's PUBLISH.
func (c *conn) onPublish(pk *packets.Packet) error {
	c.b.stats.msgsRecv.Add(1)
	if pk.FixedHeader.Qos > 0 && pk.PacketID == 0 {
		return failure(rcProtocolError, "PUBLISH QoS %d without a packet identifier", pk.FixedHeader.Qos) // [MQTT-2.2.1-3]
	}
	if len(pk.Properties.SubscriptionIdentifier) > 0 {
		return failure(rcProtocolError, "PUBLISH from a client carries a subscription identifier") // [MQTT-3.3.4-6]
	}
	topic := pk.TopicName
	if c.v5 && pk.Properties.TopicAliasFlag {
		a := int(pk.Properties.TopicAlias)
		if a == 0 || a > c.b.opts.TopicAliasMax {
			return failure(rcTopicAliasInvalid, "topic alias %d is outside 1..%d", a, c.b.opts.TopicAliasMax) // [MQTT-3.3.2-9] [MQTT-3.3.2-10]
		}
		if c.inAliases == nil {
			c.inAliases = make([]string, c.b.opts.TopicAliasMax+1)
		}
		if topic == "" {
			topic = c.inAliases[a]
			if topic == "" {
				return failure(rcProtocolError, "topic alias %d is not set", a)
			}
		} else {
			c.inAliases[a] = strings.Clone(topic)
		}
	} else if c.v5 && topic == "" {
		// A protocol error in MQTT 5 (§3.3.2.3.4), not a bad topic name.
		return failure(rcProtocolError, "PUBLISH with neither a topic name nor a topic alias")
	}
	if err := matcher.ValidateTopic(topic); err != nil {
		return failure(rcTopicNameInvalid, "%v", err) // [MQTT-3.3.2-1] [MQTT-3.3.2-2]
	}
	qos := pk.FixedHeader.Qos
	// Clients may not publish into the broker's own $SYS topics, and the
	// ACL decides the rest, other $ topics included.
	allowed := !matcher.IsSys(topic) && c.perms.Load().CanPublish(topic)
	fx := &effects{}
	pid := pk.PacketID

	if qos == 2 {
		c.s.mu.Lock()
		_, dup := c.s.awaitingRel[pk.PacketID]
		if !dup && len(c.s.awaitingRel) >= c.b.opts.ReceiveMaximum {
			c.s.mu.Unlock()
			return failure(rcReceiveMaxExceeded, "more than %d QoS 2 publishes awaiting PUBREL", c.b.opts.ReceiveMaximum) // [MQTT-3.3.4-7]
		}
		if !dup && allowed {
			if c.s.awaitingRel == nil {
				c.s.awaitingRel = make(map[uint16]struct{})
			}
			c.s.awaitingRel[pk.PacketID] = struct{}{}
			if c.s.persistent(c.b) {
				// Stored with the message's effects, before PUBREC: a
				// resend after a crash must still be known as one.
				fx.batch.AddAwaitingRel(c.clientID, pid)
			}
		}
		c.s.mu.Unlock()
		if dup {
			// Already routed: acknowledge again, deliver nothing twice
			// [MQTT-4.3.3-10].
			c.ackAfter(fx, func(error) []byte { return mqttwire.Ack(packets.Pubrec, pid, rcSuccess, c.v5, "") })
			return nil
		}
	}
	if !allowed {
		c.b.log.Debug("publish denied", "client", c.clientID, "user", c.user, "topic", topic)
		if qos > 0 {
			kind := byte(packets.Puback)
			if qos == 2 {
				kind = packets.Pubrec
			}
			ack := mqttwire.Ack(kind, pk.PacketID, rcNotAuthorized, c.v5, c.ackReason("not authorized to publish to "+topic))
			if c.maxOut > 0 && uint32(len(ack)) > c.maxOut {
				// The reason string gives way to the client's Maximum
				// Packet Size [MQTT-3.4.2-2] [MQTT-3.5.2-2].
				ack = mqttwire.Ack(kind, pk.PacketID, rcNotAuthorized, c.v5, "")
			}
			c.ackAfter(fx, func(error) []byte { return ack })
		}
		return nil
	}
	var props *packets.Properties
	if c.v5 {
		props = &pk.Properties
	}
	// topic and payload point into the packet's own buffer, which the
	// message keeps; an alias-resolved topic is the alias table's copy.
	m := newMessage(topic, pk.Payload, qos, pk.FixedHeader.Retain, props, time.Now())
	m.owner = c.user
	c.b.publish(m, c.s.handle, fx)
	if qos == 2 && c.v5 && (fx.topicRefused || fx.retainRefused || fx.refused) {
		// Its PUBREC refuses it, which ends the flow: the identifier's
		// next PUBLISH is a new message [MQTT-4.3.3-9], after a restart
		// too, or that message would be taken for a resend and lost.
		c.s.mu.Lock()
		delete(c.s.awaitingRel, pid)
		if c.s.persistent(c.b) {
			fx.batch.DeleteAwaitingRel(c.clientID, pid)
		}
		c.s.mu.Unlock()
	}
	if qos == 0 {
		c.b.commitLazy(fx) // QoS 0 is never fsynced for its own sake
		return nil
	}
	// The acknowledgement waits until every durable effect is on disk.
	kind := byte(packets.Puback)
	if qos == 2 {
		kind = packets.Pubrec
	}
	c.ackAfter(fx, func(err error) []byte {
		switch {
		case err != nil:
			c.b.log.Debug("publish not stored", "client", c.clientID, "topic", m.topic, "err", err)
			if qos == 2 {
				c.forgetRel(pid) // the resend must count as new [MQTT-4.3.3-9]
			}
			if !c.v5 {
				// MQTT 3.1.1 cannot refuse a publish: close instead of
				// acknowledging what was not stored; the client resends.
				c.shutdown(noDisconnect, "")
				return nil
			}
			return mqttwire.Ack(kind, pid, rcQuotaExceeded, true, c.ackReason("not stored: the gateway's storage failed"))
		case fx.topicRefused && c.v5:
			// Told before a full queue: sending it again cannot help. 3.1.1
			// has no code for it, and closing would only bring it back.
			return mqttwire.Ack(kind, pid, rcTopicNameInvalid, true, c.ackReason("a bridge's upstream does not take this topic (bridges[].topic_rules); delivered locally, not forwarded"))
		case fx.retainRefused && c.v5:
			// 3.1.1 has no code to say it; its publisher is acknowledged.
			return mqttwire.Ack(kind, pid, rcQuotaExceeded, true, c.ackReason("the retained store is full (broker.max_retained_*); delivered, not retained"))
		case fx.refused && c.v5:
			return mqttwire.Ack(kind, pid, rcQuotaExceeded, true, c.ackReason("a queue it must go to is full (a subscriber's, or a bridge's outbox)"))
		}
		return mqttwire.Ack(kind, pid, rcSuccess, c.v5, "")
	})
	return nil
}

// forgetRel drops an inbound QoS 2 identifier whose PUBREC was a failure.
func (c *conn) forgetRel(pid uint16) {
	c.s.mu.Lock()
	delete(c.s.awaitingRel, pid)
	c.s.mu.Unlock()
}

// onDisconnect handles a client's DISCONNECT: the end of a normal close.
func (c *conn) onDisconnect(pk *packets.Packet) error {
	if c.v5 && pk.Properties.SessionExpiryIntervalFlag {
		if c.askedExpiry == 0 && pk.Properties.SessionExpiryInterval != 0 {
			// [MQTT-3.14.2-2]: a session that was to end may not be
			// revived at DISCONNECT.
			return failure(rcProtocolError, "session expiry set at DISCONNECT after CONNECT asked for 0")
		}
		c.s.mu.Lock()
		c.s.expiry = min(time.Duration(pk.Properties.SessionExpiryInterval)*time.Second, c.b.opts.MaxSessionExpiry)
		c.s.mu.Unlock()
	}
	if pk.ReasonCode != rcSuccess {
		// Only 0x00 discards the will [MQTT-3.14.4-3]: 0x04 asks for
		// it, and an error code ends the connection as a failure does.
		return errDisconnectWithWill
	}
	// Discard it now: a new connection may take the session over before
	// this one is detached, and must not find the will armed.
	c.s.mu.Lock()
	if c.s.conn == c {
		c.s.will = nil
	}
	c.s.mu.Unlock()
	return errClientGone
}

var errDisconnectWithWill = errors.New("client disconnected asking for its will")

// end runs once when the packet loop stops: it reports the reason to the
// client (MQTT 5), detaches the session and handles the will.
func (c *conn) end(err error) {
	var we *mqttwire.Error
	switch {
	case errors.Is(err, errClientGone), errors.Is(err, errDisconnectWithWill):
		c.shutdown(noDisconnect, "")
	case errors.As(err, &we):
		c.b.log.Info("closing connection", "client", c.clientID, "remote", c.remote, "reason", we.Reason)
		c.shutdown(int(we.Code), we.Reason)
	case errors.Is(err, os.ErrDeadlineExceeded):
		if c.closingNow() {
			c.shutdown(noDisconnect, "")
			break
		}
		c.b.log.Info("keep alive timeout", "client", c.clientID, "remote", c.remote, "keepalive", c.keepalive)
		c.shutdown(rcKeepAliveTimeout, "")
	default:
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.b.log.Debug("connection lost", "client", c.clientID, "remote", c.remote, "err", err)
		}
		c.shutdown(noDisconnect, "")
	}
	normal := errors.Is(err, errClientGone)
	c.b.detach(c, normal)
}

func (c *conn) closingNow() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.closing
}
