package broker

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// message is one application message inside the broker. It is immutable
// once routed: every subscriber holds the same *message and, where their
// wire form is the same, the same encoded bytes.
type message struct {
	topic   string
	payload []byte
	props   *packets.Properties // MQTT 5 properties passed through; nil for none
	expiry  int64               // unix nanoseconds when it expires, 0 for never
	size    int                 // bytes it costs a queue: topic, payload, properties
	qos     byte
	retain  bool
	// local marks the gateway's own messages (in-process clients): their
	// retained changes are counted against the retained bounds, never
	// refused. owner is the user name of the client that published it
	// otherwise, whom its retained change counts for.
	local bool
	owner string

	// wire caches the encoded PUBLISH per variant (see variant) so that a
	// message going to many subscribers is encoded once per variant.
	wire [2 * 3 * 2]atomic.Pointer[[]byte]
	// stored caches the message as storage keeps it (see storedMessage).
	stored atomic.Pointer[storage.Message]
}

// newMessage builds a message; props may be nil. The message keeps topic,
// payload and props, so callers pass values they will not change.
func newMessage(topic string, payload []byte, qos byte, retain bool, props *packets.Properties, now time.Time) *message {
	m := &message{topic: topic, payload: payload, qos: qos, retain: retain}
	m.size = queuedCost(len(topic) + len(payload))
	if props != nil {
		if props.MessageExpiryInterval > 0 {
			m.expiry = now.Add(time.Duration(props.MessageExpiryInterval) * time.Second).UnixNano()
		}
		p := passThrough(props)
		if p != nil {
			m.props = p
			n := len(p.ContentType) + len(p.ResponseTopic) + len(p.CorrelationData)
			for _, u := range p.User {
				n += len(u.Key) + len(u.Val) + 4
			}
			m.size += 2 * n
		}
	}
	return m
}

// queuedCost is what a message of n topic, payload and property bytes
// counts against a client's or session's byte budget
// (broker.max_queued_bytes): the bytes twice (as received, and encoded for
// the subscriber) and 256 bytes for the message and its queue entry, what
// it pins when the subscriber is its only holder, so a budget bounds real
// memory; a message shared with other subscribers pins less.
func queuedCost(n int) int { return 2*n + 256 }

// storedSize estimates what the message's record costs in the state file,
// for the budget of all sessions together (storage.max_queued_bytes),
// which counts bytes on disk: its bytes once and 64 for the record.
func (m *message) storedSize() int {
	return (m.size-queuedCost(0))/2 + 64
}

// passThrough keeps the PUBLISH properties a receiver must get unchanged
// [MQTT-3.3.2-15] to [MQTT-3.3.2-20]: payload format, content type, response
// topic, correlation data and user properties, in order [MQTT-3.3.2-18].
// It returns nil when there are none.
func passThrough(in *packets.Properties) *packets.Properties {
	if !in.PayloadFormatFlag && in.ContentType == "" && in.ResponseTopic == "" &&
		len(in.CorrelationData) == 0 && len(in.User) == 0 {
		return nil
	}
	return &packets.Properties{
		PayloadFormat:     in.PayloadFormat,
		PayloadFormatFlag: in.PayloadFormatFlag,
		ContentType:       in.ContentType,
		ResponseTopic:     in.ResponseTopic,
		CorrelationData:   in.CorrelationData,
		User:              in.User,
	}
}

// expired reports whether the message's expiry interval has passed
// [MQTT-3.3.2-5].
func (m *message) expired(now int64) bool {
	return m.expiry != 0 && now >= m.expiry
}

// variant numbers a wire form: protocol version, QoS and retain flag.
func variant(v5 bool, qos byte, retain bool) int {
	i := int(qos) * 2
	if retain {
		i++
	}
	if v5 {
		i += 6
	}
	return i
}

// encoded returns the PUBLISH bytes of variant (v5, qos, retain) with a zero
// packet identifier, encoding it on first use. Messages with an expiry are
// not cached: the remaining interval they carry changes as they wait
// [MQTT-3.3.2-6].
func (m *message) encoded(v5 bool, qos byte, retain bool) []byte {
	if m.expiry != 0 && v5 {
		return m.encode(nil, v5, qos, retain, publishOpts{now: time.Now().UnixNano()})
	}
	slot := &m.wire[variant(v5, qos, retain)]
	if b := slot.Load(); b != nil {
		return *b
	}
	b := m.encode(nil, v5, qos, retain, publishOpts{})
	slot.Store(&b)
	return b
}

// publishOpts are the per-receiver parts of a PUBLISH, used when the shared
// bytes cannot serve: subscription identifiers and topic aliases.
type publishOpts struct {
	subIDs    []uint32
	alias     uint16
	aliasOnly bool  // send the alias with an empty topic [MQTT-3.3.2-12]
	now       int64 // for the remaining expiry interval; 0 when the message has none
}

// pidOffset returns where the packet identifier sits in an encoded PUBLISH
// of QoS 1 or 2: after the fixed header and the topic.
func pidOffset(b []byte) int {
	_, lenBytes, _ := mqttwire.Varint(b[1:])
	i := 1 + lenBytes
	return i + 2 + int(binary.BigEndian.Uint16(b[i:]))
}

// encode appends the PUBLISH to dst with a zero packet identifier and DUP
// clear; the writer fills both in as it sends.
func (m *message) encode(dst []byte, v5 bool, qos byte, retain bool, o publishOpts) []byte {
	topic := m.topic
	if o.aliasOnly {
		topic = ""
	}
	var props []byte
	if v5 {
		props = m.encodeProps(o)
	}
	n := 2 + len(topic) + len(props) + len(m.payload)
	if qos > 0 {
		n += 2
	}
	h := byte(packets.Publish<<4) | qos<<1
	if retain {
		h |= 1
	}
	dst = mqttwire.AppendHeader(dst, h, n)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(topic)))
	dst = append(dst, topic...)
	if qos > 0 {
		dst = append(dst, 0, 0)
	}
	dst = append(dst, props...)
	return append(dst, m.payload...)
}

// encodeProps returns the MQTT 5 property block, with its length prefix.
func (m *message) encodeProps(o publishOpts) []byte {
	var p packets.Properties
	if m.props != nil {
		p = *m.props
	}
	if m.expiry != 0 {
		now := o.now
		if now == 0 {
			now = time.Now().UnixNano()
		}
		// The remaining lifetime, rounded up so that a message never
		// arrives claiming to have expired already.
		left := (m.expiry - now + int64(time.Second) - 1) / int64(time.Second)
		p.MessageExpiryInterval = uint32(max(left, 1))
	}
	if len(o.subIDs) > 0 {
		p.SubscriptionIdentifier = make([]int, len(o.subIDs))
		for i, id := range o.subIDs {
			p.SubscriptionIdentifier[i] = int(id)
		}
	}
	p.TopicAlias = o.alias
	p.TopicAliasFlag = o.alias != 0
	var buf bytes.Buffer
	// AllowResponseInfo lets the codec write response topic and
	// correlation data, which a PUBLISH always passes through.
	p.Encode(packets.Publish, packets.Mods{AllowResponseInfo: true}, &buf, 0)
	return buf.Bytes()
}
