package broker

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// routeBuf is the scratch space of one publish: the matcher's result and
// the sessions it names. Pooled, so routing allocates nothing per message
// once warm.
type routeBuf struct {
	r        matcher.Result
	sessions []*session
	ids      []uint32
}

// offer hands m to every Outbound; one that refuses it marks the publish
// refused (0x97 for an MQTT 5 publisher, or 0x90 when its topic is what
// was refused), while local subscribers still get it.
func (b *Broker) offer(out []Outbound, m *message, from matcher.Handle, fx *effects) {
	o := Offered{Topic: m.topic, Payload: m.payload, QoS: m.qos, Retain: m.retain}
	if from != matcher.NoHandle {
		b.hmu.RLock()
		if int(from) < len(b.handles) && b.handles[from] != nil {
			o.From = b.handles[from].id
		}
		b.hmu.RUnlock()
	}
	var batch *storage.Batch
	if b.store != nil {
		batch = &fx.batch
	}
	for _, ob := range out {
		switch err := ob.Offer(&o, batch); {
		case err == nil:
		case errors.Is(err, ErrTopicRefused):
			fx.topicRefused = true
		default:
			fx.refused = true
			b.stats.refused.Add(1)
		}
	}
}

// oneID holds the one-element identifier lists of the small identifiers,
// shared by every delivery that carries exactly one of them: delivery
// identifier lists are never modified, and most deliveries carry one
// small identifier (an in-process client numbers its subscriptions from
// 1), so sharing saves an allocation per delivered message.
var oneID = func() (t [256][1]uint32) {
	for i := range t {
		t[i][0] = uint32(i)
	}
	return t
}()

var routeBufs = sync.Pool{New: func() any { return new(routeBuf) }}

// publish routes m to every matching session and stores or clears it as
// the retained message of its topic. from is the publishing session, for
// No Local; NoHandle for messages the broker makes. It returns the number
// of sessions matched.
//
// With fx, what must be durable before the publisher is acknowledged (the
// retained change, deliveries to persistent sessions) goes into fx's
// batch; the caller commits it. Without fx nothing is stored: $SYS.
// Every topic but $SYS is offered to the Outbounds: a bridge's routes
// decide, and a filter beginning with a wildcard matches no $ topic.
func (b *Broker) publish(m *message, from matcher.Handle, fx *effects) int {
	if fx != nil && !matcher.IsSys(m.topic) {
		if out := *b.outbound.Load(); len(out) > 0 {
			b.offer(out, m, from, fx)
		}
	}
	rb := routeBufs.Get().(*routeBuf)
	if m.retain {
		// A subscription made meanwhile gets m once, live or from its
		// retained scan, not both: see retainedStore.
		b.retained.change(m, fx, func() { b.index.Match(m.topic, from, &rb.r) })
	} else {
		b.index.Match(m.topic, from, &rb.r)
	}
	ds := rb.r.Deliveries
	b.hmu.RLock()
	for _, d := range ds {
		rb.sessions = append(rb.sessions, b.handles[d.Handle])
	}
	b.hmu.RUnlock()
	for i, d := range ds {
		s := rb.sessions[i]
		if s == nil {
			continue
		}
		dl := delivery{
			msg: m,
			qos: min(m.qos, d.Opts.QoS()), // [MQTT-3.8.4-8]
			// The retain flag survives only with Retain As Published
			// (MQTT 5 [MQTT-3.3.1-12]); 3.1.1 subscriptions never have
			// it, and get it cleared (3.1.1 [MQTT-3.3.1-9]).
			retain: m.retain && d.Opts&matcher.RetainAsPublished != 0,
		}
		if d.ID != 0 {
			rb.ids = rb.r.IDs(i, rb.ids[:0]) // [MQTT-3.3.4-3] [MQTT-3.3.4-5]
			switch ids := rb.ids; {
			case len(ids) == 1 && ids[0] < uint32(len(oneID)):
				dl.subIDs = oneID[ids[0]][:]
			case len(ids) > 0:
				dl.subIDs = slices.Clone(ids)
			}
		}
		s.mu.Lock()
		s.deliverLocked(b, dl, fx)
		s.mu.Unlock()
	}
	clear(rb.sessions)
	rb.sessions = rb.sessions[:0]
	routeBufs.Put(rb)
	return len(ds)
}

// onSubscribe handles SUBSCRIBE: each filter is checked and subscribed on
// its own, SUBACK answers them all in order [MQTT-3.8.4-6], and retained
// messages follow it.
func (c *conn) onSubscribe(pk *packets.Packet) error {
	b := c.b
	if pk.PacketID == 0 {
		return failure(rcProtocolError, "SUBSCRIBE without a packet identifier") // [MQTT-2.2.1-3]
	}
	if len(pk.Filters) == 0 {
		return failure(rcProtocolError, "SUBSCRIBE with no filters") // [MQTT-3.8.3-2]
	}
	var id uint32
	if c.v5 && len(pk.Properties.SubscriptionIdentifier) > 0 {
		v := pk.Properties.SubscriptionIdentifier[0]
		if v <= 0 || v > mqttwire.MaxSubscriptionID {
			return failure(rcProtocolError, "subscription identifier %d is outside 1..%d", v, mqttwire.MaxSubscriptionID)
		}
		id = uint32(v)
	}
	var wantRetained []retainedFor
	// On every path: a scan counted and never ended would keep the
	// retained store from forgetting its recent changes.
	defer func() { b.retained.scanned(len(wantRetained)) }()
	codes := make([]byte, len(pk.Filters))
	s := c.s
	for i, f := range pk.Filters {
		code, err := c.subscribeOne(f, id, func(w retainedFor) {
			wantRetained = append(wantRetained, w)
		})
		if err != nil {
			return err
		}
		codes[i] = code
	}
	// A persistent session's subscriptions are on disk before SUBACK.
	s.mu.Lock()
	var bt storage.Batch
	if s.persistent(b) {
		for i, f := range pk.Filters {
			if sub, ok := s.subs[f.Filter]; ok && codes[i] < 0x80 {
				bt.PutSub(s.id, storage.Sub{Filter: f.Filter, Opts: byte(sub.opts), ID: sub.id})
			}
		}
	}
	s.mu.Unlock()
	if !bt.Empty() {
		if err := b.store.CommitWait(&bt); err != nil {
			return failure(rcUnspecified, "subscriptions not stored: %v", err)
		}
	}
	ack := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: pk.PacketID, ReasonCodes: codes, ProtocolVersion: 4}
	if c.v5 {
		ack.ProtocolVersion = 5
	}
	var ids []uint32
	if id != 0 {
		ids = []uint32{id}
	}
	suback := encodePacket(ack)
	s.sendRetained(b, func() { c.enqueueControl(suback) }, wantRetained, ids)
	wantRetained = nil // the session's scans now
	return nil
}

// errSessionEnded ends a connection whose session ended under it.
var errSessionEnded = errors.New("session ended: taken over or closed")

// subscribeOne subscribes one filter and returns its SUBACK code. It calls
// retained when the filter's retained messages are due; the caller sends
// them, then calls retainedStore.scanned.
func (c *conn) subscribeOne(f packets.Subscription, id uint32, retained func(retainedFor)) (byte, error) {
	b := c.b
	fail := func(v5code byte) (byte, error) {
		if c.v5 {
			return v5code, nil
		}
		return 0x80, nil // the only 3.1.1 failure code [MQTT-3.9.3-2]
	}
	if err := matcher.ValidateFilter(f.Filter); err != nil {
		b.log.Debug("subscribe refused", "client", c.clientID, "filter", f.Filter, "err", err)
		return fail(rcFilterInvalid)
	}
	_, _, shared := matcher.SplitShared(f.Filter)
	if shared && f.NoLocal {
		return 0, failure(rcProtocolError, "No Local on shared subscription %q", f.Filter) // [MQTT-3.8.3-4]
	}
	if f.RetainHandling == 3 {
		return 0, failure(rcProtocolError, "retain handling 3") // [MQTT-3.8.3-5]
	}
	opts := matcher.Options(f.Qos)
	if f.NoLocal {
		opts |= matcher.NoLocal
	}
	if f.RetainAsPublished {
		opts |= matcher.RetainAsPublished
	}
	opts |= matcher.Options(f.RetainHandling<<4) & matcher.RetainHandlingMask

	s := c.s
	s.mu.Lock()
	if s.ended {
		// Taken over with a clean start, or closed, while this packet
		// was handled: a subscription made now would outlive the
		// session in the index.
		s.mu.Unlock()
		return 0, errSessionEnded
	}
	// Decided under s.mu with the session's permissions, so that a reload
	// of the rules (SetACL) comes wholly before or after it.
	grant := s.perms.Subscribe(f.Filter)
	if grant == auth.Refused {
		s.mu.Unlock()
		b.log.Debug("subscribe denied", "client", c.clientID, "user", c.user, "filter", f.Filter)
		return fail(rcNotAuthorized)
	}
	_, existed := s.subs[f.Filter]
	if !existed && c.local == nil {
		if code, ok := c.admitFilter(s, f.Filter); !ok {
			s.mu.Unlock()
			return fail(code)
		}
	}
	// Retained messages: not for shared subscriptions (MQTT 5 §4.8.2);
	// retain handling 0 sends them, 1 only for a new subscription, 2
	// never (MQTT 5 [MQTT-3.3.1-9] to [MQTT-3.3.1-11]).
	rh := f.RetainHandling
	due := !shared && (rh == 0 || (rh == 1 && !existed))
	// One copy for the index, the session and a retained scan alike:
	// f.Filter points into the packet's buffer, which must not outlive
	// the packet (a scan kept by a persistent session would keep a
	// SUBSCRIBE of a hundred long filters whole).
	filter := strings.Clone(f.Filter)
	_, inner, _ := matcher.SplitShared(filter)
	scanTo, err := b.retained.subscribe(due, func() error {
		_, err := b.index.Subscribe(s.handle, filter, opts, id)
		return err
	})
	if err != nil {
		s.mu.Unlock()
		return fail(rcFilterInvalid)
	}
	s.subs[filter] = subscription{opts: opts, id: id, checked: grant == auth.Checked}
	s.recheck()
	s.mu.Unlock()
	if due {
		retained(retainedFor{filter: inner, qos: f.Qos, scanTo: scanTo})
	}
	return f.Qos, nil // [MQTT-3.9.3-1]
}

// onUnsubscribe handles UNSUBSCRIBE; UNSUBACK answers every filter
// [MQTT-3.10.4-4] [MQTT-3.10.4-5].
func (c *conn) onUnsubscribe(pk *packets.Packet) error {
	if pk.PacketID == 0 {
		return failure(rcProtocolError, "UNSUBSCRIBE without a packet identifier")
	}
	if len(pk.Filters) == 0 {
		return failure(rcProtocolError, "UNSUBSCRIBE with no filters") // [MQTT-3.10.3-2]
	}
	codes := make([]byte, len(pk.Filters))
	s := c.s
	s.mu.Lock()
	var bt storage.Batch
	for i, f := range pk.Filters {
		if _, ok := s.subs[f.Filter]; ok {
			c.b.index.Unsubscribe(s.handle, f.Filter)
			delete(s.subs, f.Filter)
			s.recheck()
			s.endScansLocked(f.Filter)
			codes[i] = rcSuccess
			if s.persistent(c.b) {
				bt.DeleteSub(s.id, f.Filter)
			}
		} else {
			codes[i] = rcNoSubscriptionExists
		}
	}
	s.mu.Unlock()
	if !bt.Empty() {
		if err := c.b.store.CommitWait(&bt); err != nil {
			return failure(rcUnspecified, "unsubscribe not stored: %v", err)
		}
	}
	ack := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsuback}, PacketID: pk.PacketID, ReasonCodes: codes, ProtocolVersion: 4}
	if c.v5 {
		ack.ProtocolVersion = 5
	}
	c.enqueueControl(encodePacket(ack))
	return nil
}

// checkSubscribeOptions validates the options bytes of a SUBSCRIBE body,
// which the codec does not: reserved bits must be zero [MQTT-3.8.3-5].
func checkSubscribeOptions(body []byte, v5 bool) error {
	if len(body) < 2 {
		// Not under decode's recover: a short body must not reach the
		// slicing below.
		return failure(rcMalformed, "SUBSCRIBE without a packet identifier")
	}
	off := 2
	if v5 {
		n, lb, ok := mqttwire.Varint(body[off:])
		if !ok {
			return failure(rcMalformed, "SUBSCRIBE properties length")
		}
		off += lb + n
	}
	for off < len(body) {
		if off+2 > len(body) {
			return failure(rcMalformed, "truncated SUBSCRIBE")
		}
		off += 2 + int(binary.BigEndian.Uint16(body[off:]))
		if off >= len(body) {
			return failure(rcMalformed, "SUBSCRIBE filter without options")
		}
		o := body[off]
		if (v5 && o&0xC0 != 0) || (!v5 && o&0xFC != 0) {
			return failure(rcMalformed, "reserved bits set in subscription options 0x%02X", o)
		}
		off++
	}
	return nil
}
