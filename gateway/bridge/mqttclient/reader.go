package mqttclient

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
)

// readLoop is the reader goroutine, and it ends the connection.
func (c *Client) readLoop() {
	err := c.readPackets()
	var pe *mqttwire.Error
	var de *DisconnectError
	switch {
	case errors.As(err, &pe):
		err = fmt.Errorf("bridge: %s: protocol error from the server: %w", c.desc, err)
	case errors.As(err, &de):
		err = fmt.Errorf("bridge: %s: %w", c.desc, err)
	}
	if pe != nil && c.v5 {
		// Tell the server why (§4.13); the writer closes once it is
		// written, or the deadline does.
		d := encode(&packets.Packet{
			FixedHeader:     packets.FixedHeader{Type: packets.Disconnect},
			ProtocolVersion: 5,
			ReasonCode:      pe.Code,
		})
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
	c.acks, c.pings = nil, nil
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

// readPackets reads and handles packets until the connection fails.
func (c *Client) readPackets() error {
	for {
		fh, body, err := mqttwire.ReadPacket(c.br, 0, nil)
		if err != nil {
			select {
			case <-c.stop:
				return nil // ended on purpose; the cause is already set
			default:
			}
			var pe *mqttwire.Error
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
		if err := mqttwire.Decode(&pk, body); err != nil {
			return err
		}
		return c.onPublish(&pk)
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		if err := mqttwire.Decode(&pk, body); err != nil {
			return err
		}
		c.onPubAck(fh.Type, pk.PacketID, pk.ReasonCode)
		return nil
	case packets.Pubrel:
		if err := mqttwire.Decode(&pk, body); err != nil {
			return err
		}
		code := byte(0)
		if !c.received.release(pk.PacketID) {
			code = packets.ErrPacketIdentifierNotFound.Code
		}
		c.q.push(outPacket{b: mqttwire.Ack(packets.Pubcomp, pk.PacketID, code, c.v5, "")}, false) // [MQTT-4.3.3-11]
		return nil
	case packets.Suback, packets.Unsuback:
		if err := mqttwire.Decode(&pk, body); err != nil {
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
		// The server answers PINGREQs in order [MQTT-3.12.4-1].
		c.mu.Lock()
		if len(c.pings) > 0 {
			pw := c.pings[0]
			c.pings = c.pings[1:]
			pw.wait.got = true
			if pw.got != nil {
				close(pw.got)
			}
		}
		c.mu.Unlock()
		return nil
	case packets.Disconnect:
		if !c.v5 {
			return mqttwire.Errorf(packets.ErrProtocolViolation.Code, "DISCONNECT from a 3.1.1 server")
		}
		de := &DisconnectError{}
		if len(body) > 0 {
			de.Code = body[0]
		}
		if len(body) > 1 {
			if err := mqttwire.Decode(&pk, body); err != nil {
				return err
			}
			de.Reason, de.ServerReference = pk.Properties.ReasonString, pk.Properties.ServerReference
		}
		return de
	default:
		return mqttwire.Errorf(packets.ErrProtocolViolation.Code, "the server sent %s", strings.ToUpper(mqttwire.PacketName(fh.Type)))
	}
}

// onPublish delivers a PUBLISH and acknowledges it after OnMessage
// returns; a QoS 2 message is delivered once until its PUBREL.
func (c *Client) onPublish(pk *packets.Packet) error {
	qos, pid := pk.FixedHeader.Qos, pk.PacketID
	if qos > 0 && pid == 0 {
		return mqttwire.Errorf(packets.ErrProtocolViolation.Code, "PUBLISH QoS %d without a packet id", qos) // [MQTT-2.2.1-3]
	}
	if pk.Properties.TopicAliasFlag {
		// We announced no aliases (Topic Alias Maximum 0) [MQTT-3.1.2-27].
		return mqttwire.Errorf(packets.ErrTopicAliasInvalid.Code, "PUBLISH with topic alias %d; we accept none", pk.Properties.TopicAlias)
	}
	if err := matcher.ValidateTopic(pk.TopicName); err != nil {
		return mqttwire.Errorf(packets.ErrTopicNameInvalid.Code, "PUBLISH: %v", err)
	}
	if qos == 2 && c.received.has(pid) {
		// Delivered before; the PUBREC did not arrive [MQTT-4.3.3-10].
		c.q.push(outPacket{b: mqttwire.Ack(packets.Pubrec, pid, 0, c.v5, "")}, false)
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
		c.q.push(outPacket{b: mqttwire.Ack(packets.Puback, pid, 0, c.v5, "")}, false) // §4.3.2
	case 2:
		c.received.add(pid)
		c.q.push(outPacket{b: mqttwire.Ack(packets.Pubrec, pid, 0, c.v5, "")}, false) // §4.3.3
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
			// Let the server free the id [MQTT-4.3.3-4]: Packet
			// Identifier Not Found says we had nothing under it.
			c.q.push(outPacket{b: mqttwire.Ack(packets.Pubrel, pid, packets.ErrPacketIdentifierNotFound.Code, c.v5, "")}, false)
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
		c.q.push(outPacket{b: mqttwire.Ack(packets.Pubrel, pid, 0, c.v5, ""), wait: f.wait}, false) // [MQTT-4.3.3-4]
		return
	}
	// PUBACK, PUBCOMP, or a PUBREC that failed the message, which ends
	// its flow [MQTT-4.3.3-4].
	delete(c.flights, pid)
	c.mu.Unlock()
	f.done(nil, reason)
}
