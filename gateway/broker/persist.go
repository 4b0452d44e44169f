package broker

import (
	"bytes"
	"fmt"
	"time"

	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// What the broker writes to storage, and when:
//
//   - A QoS 1/2 PUBLISH: its retained change, an Enqueue for every
//     persistent session it goes to, and (QoS 2) its packet identifier as
//     awaiting PUBREL, in one batch; PUBACK/PUBREC go out once that batch
//     is fsynced [the acknowledgement rule].
//   - A QoS 0 PUBLISH: its retained change, lazily (no fsync of its own).
//   - SUBSCRIBE/UNSUBSCRIBE of a persistent session: committed before
//     SUBACK/UNSUBACK.
//   - PUBREL: the identifier's removal, committed before PUBCOMP.
//   - A subscriber's PUBREC of a queued QoS 2 message: committed before
//     PUBREL, so that a restart resends PUBREL, never the PUBLISH.
//   - Acknowledgements from subscribers, packet identifiers of messages
//     sent from the queue, session records at disconnect: lazily. Losing
//     one of these to a crash can only repeat a QoS 1 delivery, which QoS 1
//     allows; QoS 2 messages are sent only once their identifier is on
//     disk, and PUBREL only once their PUBREC is, so exactly once holds
//     across a crash.

// storedMessage is m as storage keeps it, built once per message: a
// publish going to many persistent sessions encodes its properties once.
// The result is shared; callers copy it before changing a field.
func storedMessage(m *message) *storage.Message {
	if sm := m.stored.Load(); sm != nil {
		return sm
	}
	sm := &storage.Message{Topic: m.topic, Payload: m.payload, QoS: m.qos, Retain: m.retain, Expiry: m.expiry}
	if m.props != nil {
		var buf bytes.Buffer
		m.props.Encode(packets.Publish, packets.Mods{AllowResponseInfo: true}, &buf, 0)
		sm.Props = buf.Bytes()
	}
	m.stored.Store(sm)
	return sm
}

// messageFromStored turns a stored message back into a routable one.
func messageFromStored(sm *storage.Message) (*message, error) {
	var props *packets.Properties
	if len(sm.Props) > 0 {
		props = new(packets.Properties)
		if _, err := props.Decode(packets.Publish, bytes.NewBuffer(sm.Props)); err != nil {
			return nil, fmt.Errorf("stored properties of %q: %w", sm.Topic, err)
		}
	}
	m := newMessage(sm.Topic, sm.Payload, sm.QoS, sm.Retain, props, time.Now())
	m.expiry = sm.Expiry
	return m, nil
}

// record is the session's own record for storage; the caller holds s.mu.
func (s *session) record() *storage.Session {
	r := &storage.Session{ClientID: s.id, User: s.user, Expiry: s.expiry, ExpireAt: s.expireAt}
	if w := s.will; w != nil {
		// The will properties are kept whole: its message expiry
		// interval counts from when it is published, not from now.
		var props []byte
		if w.props != nil {
			var buf bytes.Buffer
			w.props.Encode(packets.WillProperties, packets.Mods{AllowResponseInfo: true}, &buf, 0)
			props = buf.Bytes()
		}
		r.Will = &storage.Will{
			Msg:   storage.Message{Topic: w.topic, Payload: w.payload, QoS: w.qos, Retain: w.retain, Props: props},
			Delay: w.delay, At: s.willAt,
		}
	}
	return r
}

// persistent reports whether the session outlives its connection and is
// kept in storage; the caller holds s.mu.
func (s *session) persistent(b *Broker) bool {
	return b.store != nil && s.expiry > 0
}

// lazy commits a batch built by fn without waiting for it or forcing an
// fsync: acknowledgements from subscribers and session bookkeeping.
func (b *Broker) lazy(fn func(*storage.Batch)) {
	if b.store == nil {
		return
	}
	var bt storage.Batch
	fn(&bt)
	b.store.CommitLazy(&bt)
}

// restore loads the persistent sessions from storage into the broker,
// before any listener is bound. Every client was cut off by whatever
// stopped the last run, so each session is offline from now: its expiry
// counts from now if it was connected, and a will that was armed is now
// due after its delay.
func (b *Broker) restore() error {
	if b.store == nil {
		return nil
	}
	now := time.Now()
	var dead []string
	var wills []*message
	var acl storage.Batch // what the access rules took from restored sessions
	err := b.store.Load(func(st *storage.SessionState) error {
		if st.Expiry <= 0 {
			dead = append(dead, st.ClientID)
			return nil
		}
		s := &session{b: b, id: st.ClientID, user: st.User, expiry: st.Expiry, expireAt: st.ExpireAt, subs: make(map[string]subscription), stored: true}
		if s.expireAt.IsZero() {
			s.expireAt = now.Add(s.expiry)
		}
		if w := st.Will; w != nil {
			var props *packets.Properties
			if len(w.Msg.Props) > 0 {
				props = new(packets.Properties)
				if _, err := props.Decode(packets.WillProperties, bytes.NewBuffer(w.Msg.Props)); err != nil {
					return fmt.Errorf("session %q: will properties: %w", st.ClientID, err)
				}
			}
			s.will = &will{topic: w.Msg.Topic, payload: w.Msg.Payload, qos: w.Msg.QoS, retain: w.Msg.Retain, props: props, delay: w.Delay, owner: st.User}
			s.willAt = w.At
			if s.willAt.IsZero() {
				if w.Delay == 0 {
					wills = append(wills, s.will.message(now))
					s.will = nil
				} else {
					s.willAt = now.Add(w.Delay)
				}
			}
		}
		h, err := b.newHandle(s)
		if err != nil {
			return err
		}
		s.handle = h
		for _, sub := range st.Subs {
			if _, err := b.index.Subscribe(h, sub.Filter, matcher.Options(sub.Opts), sub.ID); err != nil {
				b.log.Warn("stored subscription dropped", "client", s.id, "filter", sub.Filter, "err", err)
				continue
			}
			s.subs[sub.Filter] = subscription{opts: matcher.Options(sub.Opts), id: sub.ID}
		}
		b.index.SetOnline(h, false)
		for _, pid := range st.AwaitingRel {
			if s.awaitingRel == nil {
				s.awaitingRel = make(map[uint16]struct{})
			}
			s.awaitingRel[pid] = struct{}{}
		}
		for _, q := range st.Queue {
			m, err := messageFromStored(&q.Msg)
			if err != nil {
				return fmt.Errorf("session %q: queued message %d: %w", s.id, q.Seq, err)
			}
			d := delivery{msg: m, qos: q.Msg.QoS, retain: q.Msg.Retain, seq: q.Seq}
			s.nextSeq = max(s.nextSeq, q.Seq)
			if q.PID != 0 {
				s.inflight = append(s.inflight, &flight{delivery: d, pid: q.PID, rec: q.Rec, sent: now})
				s.nextPID = max(s.nextPID, q.PID)
			} else {
				s.pending = append(s.pending, d)
				s.pendingB += m.size
			}
		}
		if over := s.pendingB - b.opts.MaxQueuedBytes; over > 0 {
			// Acknowledged messages are never dropped for a budget
			// that changed while they waited.
			s.grace = over
			b.log.Info("restored queue is over its budget; kept, new messages wait for room", "client", s.id, "bytes", s.pendingB, "budget", b.opts.MaxQueuedBytes)
		}
		// The rules may have changed since the session was stored.
		dropped, unqueued := s.applyACL(b, b.acl.Load(), &acl)
		b.logACL(s, "restored", dropped, unqueued)
		b.sessions[s.id] = s
		return nil
	})
	if err != nil {
		return fmt.Errorf("broker: restoring sessions from %s: %w", b.store.Path(), err)
	}
	if len(dead) > 0 {
		var bt storage.Batch
		for _, id := range dead {
			bt.DeleteSession(id)
		}
		b.store.CommitLazy(&bt)
	}
	if !acl.Empty() {
		b.store.CommitLazy(&acl)
	}
	b.restoredWills = wills
	b.log.Info("sessions restored", "sessions", len(b.sessions), "retained", b.store.RetainedCount())
	return nil
}

// publishOwn publishes a message the broker makes (a will), committing
// its durable effects without waiting for them.
func (b *Broker) publishOwn(m *message) {
	fx := &effects{}
	b.publish(m, matcher.NoHandle, fx)
	b.commitEffects(fx, m.qos > 0, nil)
}

// effects are the durable effects of one publish, or of messages moved
// from a persistent session's queue into its window.
type effects struct {
	batch   storage.Batch
	release []*session // sessions with QoS 2 flights waiting for this commit
	refused bool       // a persistent session's queue policy turned the message away
	// topicRefused: an Outbound refused the message's topic (a bridge's
	// upstream topic rules); local subscribers got it all the same.
	topicRefused bool
	// retainRefused: the retained store refused the message's retained
	// change for a bound (quota.go); it was delivered all the same.
	retainRefused bool

	// retained is the stored retained change in batch, if any, and
	// retainedSeq its number: marked as handed to storage once batch is.
	retained    *recentChange
	retainedSeq uint64
	// ticket, when QoS 2 messages stored in batch wait in a queue, tells
	// them when batch has gone to storage.
	ticket *ticket
}

// commitEffects commits fx: durably when durable is set or when QoS 2
// flights wait for it, lazily otherwise. done (which may be nil) runs
// after the commit, on the committer's goroutine, or at once when there
// is nothing to write; it must not block.
func (b *Broker) commitEffects(fx *effects, durable bool, done func(error)) {
	if t := fx.ticket; t != nil {
		defer t.submit()
	}
	if b.store == nil || fx.batch.Empty() {
		if done != nil {
			done(nil)
		}
		return
	}
	rc, seq := fx.retained, fx.retainedSeq
	if !durable && len(fx.release) == 0 {
		b.store.CommitLazy(&fx.batch)
		if rc != nil {
			// Only once handed over: retainedStore.tidy asks storage
			// to report when what it was handed is applied.
			rc.submit(seq)
		}
		if done != nil {
			done(nil)
		}
		return
	}
	b.store.Commit(&fx.batch, func(err error) {
		if rc != nil {
			b.retained.applied(rc, seq)
		}
		b.releaseFlights(fx)
		if done != nil {
			done(err)
		}
	})
}

// commitLazy is commitEffects without a completion. It only submits, so
// callers may hold a session's lock: commit callbacks run later, on the
// committer's goroutine.
func (b *Broker) commitLazy(fx *effects) { b.commitEffects(fx, false, nil) }

// releaseFlights sends the QoS 2 flights that waited for fx's commit.
// When the commit failed they go all the same: the message is in memory
// and its publisher has been told it was not stored.
func (b *Broker) releaseFlights(fx *effects) {
	now := time.Now()
	for i, s := range fx.release {
		if i > 0 && fx.release[i-1] == s {
			continue
		}
		s.mu.Lock()
		for _, f := range s.inflight {
			if f.awaiting != fx {
				continue
			}
			f.awaiting = nil
			if s.conn != nil && !f.held {
				f.sent = now
				s.conn.enqueueMsg(f.delivery, f.pid, false)
			}
		}
		s.mu.Unlock()
	}
}

// ackAfter sends an acknowledgement once fx is durable, keeping this
// connection's acknowledgements in the order their packets came
// [MQTT-4.6.0-2]: an acknowledgement with nothing to wait for still waits
// for earlier ones. make builds the packet from the commit's outcome.
func (c *conn) ackAfter(fx *effects, make func(err error) []byte) {
	b := c.b
	if b.store == nil || (fx.batch.Empty() && c.acksWaiting.Load() == 0) {
		c.enqueueControl(make(nil))
		return
	}
	c.acksWaiting.Add(1)
	finish := func(err error) {
		c.enqueueControl(make(err))
		c.acksWaiting.Add(-1)
	}
	if fx.batch.Empty() {
		b.store.After(finish)
		return
	}
	b.commitEffects(fx, true, finish)
}
