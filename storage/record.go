package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// Message is an application message as stored.
type Message struct {
	Topic   string
	Payload []byte
	Props   []byte // MQTT 5 properties as the caller encoded them; nil for none
	Expiry  int64  // unix nanoseconds when it expires, 0 for never
	QoS     byte
	Retain  bool
}

// Session is what a persistent session keeps between connections.
type Session struct {
	ClientID string
	User     string
	Expiry   time.Duration // session expiry interval
	ExpireAt time.Time     // when it ends; zero while its client is connected
	Will     *Will         // nil for none
}

// Will is a session's Will Message; At is set once it is waiting for its delay.
type Will struct {
	Msg   Message
	Delay time.Duration
	At    time.Time
}

// Sub is one subscription of a session.
type Sub struct {
	Filter string
	Opts   byte   // the MQTT 5 subscription options byte
	ID     uint32 // subscription identifier, 0 for none
}

// Queued is a QoS 1/2 message held for a session: in flight once it has a
// packet identifier, waiting for the window or the client before that.
type Queued struct {
	Seq uint64
	PID uint16 // 0 until sent
	Rec bool   // PUBREC received: PUBREL is due, not the message
	Msg Message
}

// SessionState is a persistent session with everything it holds, as Load
// returns it.
type SessionState struct {
	Session
	Subs        []Sub
	Queue       []Queued // in Seq order
	AwaitingRel []uint16 // inbound QoS 2 packet identifiers awaiting PUBREL
}

// ErrCorrupt wraps every error about a record that cannot be decoded.
var ErrCorrupt = errors.New("storage: corrupt record")

func corrupt(what string, key []byte) error {
	return fmt.Errorf("%w: %s %q", ErrCorrupt, what, key)
}

// Message records: flags (QoS in bits 0-1, retain in bit 2), expiry as
// 8 bytes, topic and properties each with a uvarint length, the payload to
// the end. A retained message's topic is its key; it is stored all the
// same so that one decoder serves every bucket.
func appendMessage(dst []byte, m *Message) []byte {
	f := m.QoS & 3
	if m.Retain {
		f |= 4
	}
	dst = append(dst, f)
	dst = binary.BigEndian.AppendUint64(dst, uint64(m.Expiry))
	dst = binary.AppendUvarint(dst, uint64(len(m.Topic)))
	dst = append(dst, m.Topic...)
	dst = binary.AppendUvarint(dst, uint64(len(m.Props)))
	dst = append(dst, m.Props...)
	return append(dst, m.Payload...)
}

// messageRecordSize is the length of m's record, as appendMessage writes it.
func messageRecordSize(m *Message) int {
	return 9 + uvarintLen(len(m.Topic)) + len(m.Topic) + uvarintLen(len(m.Props)) + len(m.Props) + len(m.Payload)
}

// uvarintLen is the length of n as a uvarint: 7 bits a byte.
func uvarintLen(n int) int { return (bits.Len64(uint64(n)|1) + 6) / 7 }

// messageParts is a message record split into its fields, the byte slices
// still in the record: what a reader that only measures or checks a
// record needs, without copying it.
type messageParts struct {
	flags                 byte
	expiry                int64
	topic, props, payload []byte
}

func splitMessage(b []byte) (p messageParts, ok bool) {
	if len(b) < 9 {
		return p, false
	}
	p.flags = b[0]
	if p.flags&^7 != 0 || p.flags&3 == 3 {
		return p, false
	}
	p.expiry = int64(binary.BigEndian.Uint64(b[1:]))
	if p.topic, b, ok = lenPrefixed(b[9:]); !ok {
		return p, false
	}
	if p.props, b, ok = lenPrefixed(b); !ok {
		return p, false
	}
	p.payload = b
	return p, true
}

// decodeMessage decodes a message record, copying out of b (which may be
// bbolt's memory map).
func decodeMessage(b []byte) (Message, bool) {
	p, ok := splitMessage(b)
	if !ok {
		return Message{}, false
	}
	m := Message{
		Topic: string(p.topic), Payload: append([]byte{}, p.payload...),
		Expiry: p.expiry, QoS: p.flags & 3, Retain: p.flags&4 != 0,
	}
	if len(p.props) > 0 {
		m.Props = append([]byte(nil), p.props...)
	}
	return m, true
}

func lenPrefixed(b []byte) (val, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

// Queue records: packet identifier (2 bytes), flags (bit 0: PUBREC
// received), then the message record.
func appendQueued(dst []byte, q *Queued) []byte {
	dst = binary.BigEndian.AppendUint16(dst, q.PID)
	var f byte
	if q.Rec {
		f = 1
	}
	dst = append(dst, f)
	return appendMessage(dst, &q.Msg)
}

func decodeQueued(seq uint64, b []byte) (Queued, bool) {
	q := Queued{Seq: seq}
	if len(b) < 3 || b[2]&^1 != 0 {
		return q, false
	}
	q.PID, q.Rec = binary.BigEndian.Uint16(b), b[2] == 1
	var ok bool
	q.Msg, ok = decodeMessage(b[3:])
	return q, ok
}

// Outbox records: the index of the out-route the message matched (2
// bytes), when it was queued in unix nanoseconds (8 bytes), then the
// message record. The sequence is the key.
const outboxHeader = 10

// outboxRecordSize is the length of e's record, as appendOutbox writes it.
func outboxRecordSize(e *OutboxEntry) int { return outboxHeader + messageRecordSize(&e.Msg) }

func appendOutbox(dst []byte, e *OutboxEntry) []byte {
	dst = binary.BigEndian.AppendUint16(dst, e.Route)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Added))
	return appendMessage(dst, &e.Msg)
}

// splitOutbox splits an outbox record without copying it.
func splitOutbox(b []byte) (route uint16, added int64, p messageParts, ok bool) {
	if len(b) < outboxHeader {
		return 0, 0, p, false
	}
	p, ok = splitMessage(b[outboxHeader:])
	return binary.BigEndian.Uint16(b), int64(binary.BigEndian.Uint64(b[2:])), p, ok
}

func decodeOutbox(seq uint64, b []byte) (OutboxEntry, bool) {
	e := OutboxEntry{Seq: seq}
	if len(b) < outboxHeader {
		return e, false
	}
	var ok bool
	e.Route, e.Added = binary.BigEndian.Uint16(b), int64(binary.BigEndian.Uint64(b[2:]))
	e.Msg, ok = decodeMessage(b[outboxHeader:])
	return e, ok
}

// Session records: a version byte, expiry in seconds, expire-at in unix
// nanoseconds (0 while connected), the user name, then the will if any.
const sessionRecordV1 = 1

func appendSession(dst []byte, s *Session) []byte {
	dst = append(dst, sessionRecordV1)
	dst = appendSpan(dst, s.Expiry, s.ExpireAt)
	dst = binary.AppendUvarint(dst, uint64(len(s.User)))
	dst = append(dst, s.User...)
	if s.Will == nil {
		return append(dst, 0)
	}
	dst = append(dst, 1)
	dst = appendSpan(dst, s.Will.Delay, s.Will.At)
	return appendMessage(dst, &s.Will.Msg)
}

// appendSpan appends an interval in whole seconds and the moment it runs
// out (0 for none): a session's expiry, a will's delay.
func appendSpan(dst []byte, d time.Duration, at time.Time) []byte {
	dst = binary.AppendUvarint(dst, uint64(d/time.Second))
	return binary.AppendVarint(dst, unixNano(at))
}

// decodeSpan reads what appendSpan wrote.
func decodeSpan(b []byte) (d time.Duration, at time.Time, rest []byte, ok bool) {
	secs, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, time.Time{}, nil, false
	}
	b = b[k:]
	n, k := binary.Varint(b)
	if k <= 0 {
		return 0, time.Time{}, nil, false
	}
	return time.Duration(secs) * time.Second, fromUnixNano(n), b[k:], true
}

func decodeSession(id string, b []byte) (Session, bool) {
	s := Session{ClientID: id}
	if len(b) < 1 || b[0] != sessionRecordV1 {
		return s, false
	}
	exp, at, b, ok := decodeSpan(b[1:])
	if !ok {
		return s, false
	}
	user, b, ok := lenPrefixed(b)
	if !ok || len(b) < 1 {
		return s, false
	}
	s.Expiry, s.ExpireAt, s.User = exp, at, string(user)
	if b[0] == 0 {
		return s, len(b) == 1
	}
	if b[0] != 1 {
		return s, false
	}
	delay, wat, b, ok := decodeSpan(b[1:])
	if !ok {
		return s, false
	}
	msg, ok := decodeMessage(b)
	if !ok {
		return s, false
	}
	s.Will = &Will{Msg: msg, Delay: delay, At: wat}
	return s, true
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Keys: a session's records share the prefix clientID + 0x00; MQTT
// strings cannot contain U+0000 [MQTT-1.5.4-2], so no client id is a
// prefix of another's key.
func sessionPrefix(clientID string) []byte {
	k := make([]byte, 0, len(clientID)+1)
	k = append(k, clientID...)
	return append(k, 0)
}

func subKey(clientID, filter string) []byte {
	return append(sessionPrefix(clientID), filter...)
}

func queueKey(clientID string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(sessionPrefix(clientID), seq)
}

func relKey(clientID string, pid uint16) []byte {
	return binary.BigEndian.AppendUint16(sessionPrefix(clientID), pid)
}
