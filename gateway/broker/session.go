package broker

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// session is the state MQTT keeps for one client identifier, across its
// connections when it is persistent. Its fields are guarded by mu, except
// id and handle, which never change.
type session struct {
	b      *Broker
	id     string
	handle matcher.Handle

	// mu guards everything below. Lock order: Broker.mu, then session.mu,
	// then conn.qmu.
	mu       sync.Mutex
	conn     *conn // the live connection, nil while the client is away
	user     string
	subs     map[string]subscription // by filter as subscribed, $share prefix included
	inflight []*flight               // QoS 1/2 sent and not yet completed, in send order
	pending  []delivery              // QoS 1/2 waiting for window room or for the client to return
	pendingB int                     // bytes of pending
	// grace is how far the pending messages restored at start exceed
	// broker.max_queued_bytes (a budget lowered, or counted differently,
	// since they were queued): they are kept, and only new messages wait
	// for room, until delivery brings the queue back under its budget.
	grace int
	// unstored holds, by seq, the tickets of the batches that store the
	// pending QoS 2 messages, until fill promotes them (see ticket);
	// those whose batch has gone are swept when it reaches sweepAt.
	unstored map[uint64]*ticket
	sweepAt  int
	nextPID  uint16
	nextSeq  uint64 // orders a persistent session's stored queue
	// awaitingRel holds the packet identifiers of QoS 2 PUBLISHes received
	// and routed, whose PUBREL has not come yet [MQTT-4.3.3-10].
	awaitingRel map[uint16]struct{}

	expiry   time.Duration // session expiry interval; 0 ends the session with its connection
	expireAt time.Time     // while offline: when the session ends
	will     *will         // armed while connected; pending after an abnormal disconnect
	willAt   time.Time     // when a pending will is due
	ended    bool          // removed from the broker; late deliveries are ignored
	stored   bool          // has a record in storage

	// Access control (access.go). perms are what the session's user may
	// do, worked out from acl; checked is set while some subscription
	// reaches topics the user may not read, so that each delivery is
	// checked. local marks the gateway's own clients, whom no rule binds.
	acl     *auth.ACL
	aclSeen bool
	perms   auth.Permissions
	checked bool
	local   bool

	scan scanState // retained messages on their way to new subscriptions
}

// subscription is what a session asked for on one filter.
type subscription struct {
	opts    matcher.Options
	id      uint32
	checked bool // its messages are checked with CanRead (auth.Checked)
}

// delivery is one message on its way to one session.
type delivery struct {
	msg    *message
	subIDs []uint32 // MQTT 5 subscription identifiers; nil for none
	seq    uint64   // its place in a persistent session's stored queue, 0 otherwise
	qos    byte
	retain bool
}

// ticket tells when a publish's batch has gone to storage. A QoS 2
// message queued for a persistent session keeps its publish's ticket, in
// session.unstored: fill, promoting it into the window before that batch
// has gone, sends it only after that batch is in the file, so that the
// client cannot have a message a crash could still lose. Otherwise its
// publisher, never acknowledged, would send it again, and the client
// would get it twice.
type ticket struct {
	mu        sync.Mutex
	submitted bool
	then      []func()
}

// after runs fn once t's batch has gone to storage: at once when it has,
// else on the goroutine that hands it over. fn must not block.
func (t *ticket) after(fn func()) {
	t.mu.Lock()
	if !t.submitted {
		t.then = append(t.then, fn)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	fn()
}

// gone reports whether t's batch has gone to storage.
func (t *ticket) gone() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.submitted
}

// submit notes that t's batch has gone to storage and runs what waited.
func (t *ticket) submit() {
	t.mu.Lock()
	t.submitted = true
	then := t.then
	t.then = nil
	t.mu.Unlock()
	for _, fn := range then {
		fn()
	}
}

// flight is a QoS 1/2 message sent to a client and not yet acknowledged.
type flight struct {
	delivery
	pid  uint16
	sent time.Time
	held bool // resent after a reconnect only once the window has room
	// awaiting is the commit that must store this flight's packet
	// identifier before it is sent: QoS 2 to a persistent session, so that
	// a crash cannot make it go out twice under two identifiers.
	awaiting *effects
	rec      bool // PUBREC received: waiting for PUBCOMP, resend PUBREL [MQTT-4.3.3-5]
}

// will is a client's Will Message with its delay.
type will struct {
	topic   string
	payload []byte
	props   *packets.Properties // MQTT 5 will properties; nil for 3.1.1
	delay   time.Duration
	qos     byte
	retain  bool
	owner   string // the user of the session that set it, whom its retained message counts for
}

// freePID returns a packet identifier not in use by an unacknowledged
// outbound message [MQTT-2.2.1-3]; the caller holds s.mu and has checked
// that the window is not full, so one exists.
func (s *session) freePID() uint16 {
	for {
		s.nextPID++
		if s.nextPID == 0 {
			s.nextPID = 1
		}
		used := false
		for _, f := range s.inflight {
			if f.pid == s.nextPID {
				used = true
				break
			}
		}
		if !used {
			return s.nextPID
		}
	}
}

// window is how many QoS 1/2 messages may be in flight to the client: its
// receive maximum [MQTT-3.3.4-9] capped by ours.
func (s *session) window() int {
	if s.conn == nil {
		return 0
	}
	return s.conn.window
}

// deliverLocked hands one message to the session: straight to its
// connection when there is room, into its pending queue when a QoS 1/2
// message must wait, or counted as dropped; it never blocks, and the
// caller holds s.mu. With fx, the
// deliveries to a persistent session are stored in fx's batch, and fx is
// refused when the session's queue policy turns one away.
func (s *session) deliverLocked(b *Broker, d delivery, fx *effects) {
	if s.ended {
		return
	}
	if s.checked && !s.perms.CanRead(d.msg.topic) {
		// A subscription reaching further than its user may read
		// [auth.Checked]: this message is not for this user.
		b.stats.withheld.Add(1)
		return
	}
	if d.qos == 0 {
		if s.conn == nil || !s.conn.enqueueMsg(d, 0, false) {
			b.stats.dropped.Add(1)
		}
		return
	}
	if fx != nil && s.persistent(b) {
		s.deliverStored(b, d, fx)
		return
	}
	if s.conn != nil && len(s.pending) == 0 && len(s.inflight) < s.window() {
		s.send(d)
		return
	}
	if s.conn == nil && s.expiry == 0 {
		return
	}
	if s.pendingB+d.msg.size > s.budget(b) {
		b.stats.dropped.Add(1)
		b.logDrop(s.id, "queue full")
		return
	}
	s.pending = append(s.pending, d)
	s.pendingB += d.msg.size
}

// retainedFor is a filter whose retained messages a new subscription gets,
// at the QoS it was granted, up to the retained change numbered scanTo (see
// retainedStore).
type retainedFor struct {
	filter string
	scanTo uint64
	qos    byte
}

// send puts d in flight; the caller holds s.mu, s.conn is set and the
// window has room.
func (s *session) send(d delivery) {
	f := &flight{delivery: d, pid: s.freePID(), sent: time.Now()}
	s.inflight = append(s.inflight, f)
	s.conn.enqueueMsg(d, f.pid, false)
}

// sendStored puts a queued message of a persistent session in flight: the
// packet identifier is recorded lazily for QoS 1 and durably, before the
// message goes out, for QoS 2. The caller holds s.mu.
func (s *session) sendStored(b *Broker, d delivery, fx *effects) *flight {
	f := &flight{delivery: d, pid: s.freePID(), sent: time.Now()}
	s.inflight = append(s.inflight, f)
	if d.qos == 2 {
		f.awaiting = fx
		fx.release = append(fx.release, s)
		return f
	}
	s.conn.enqueueMsg(d, f.pid, false)
	return f
}

// deliverStored queues a QoS 1/2 delivery to a persistent session, in
// storage as part of fx and in memory. The caller holds s.mu.
func (s *session) deliverStored(b *Broker, d delivery, fx *effects) {
	if !s.makeRoom(b, d.msg, fx) {
		fx.refused = true
		return
	}
	s.nextSeq++
	d.seq = s.nextSeq
	q := storage.Queued{Seq: d.seq, Msg: *storedMessage(d.msg)}
	q.Msg.QoS, q.Msg.Retain = d.qos, d.retain
	if s.conn != nil && len(s.pending) == 0 && len(s.inflight) < s.window() {
		q.PID = s.sendStored(b, d, fx).pid
	} else {
		if d.qos == 2 {
			if fx.ticket == nil {
				fx.ticket = &ticket{}
			}
			if s.unstored == nil {
				s.unstored = make(map[uint64]*ticket)
			}
			if len(s.unstored) >= max(s.sweepAt, 64) {
				for seq, t := range s.unstored {
					if t.gone() {
						delete(s.unstored, seq)
					}
				}
				s.sweepAt = 2 * len(s.unstored)
			}
			s.unstored[d.seq] = fx.ticket
		}
		s.pending = append(s.pending, d)
		s.pendingB += d.msg.size
	}
	fx.batch.Enqueue(s.id, &q)
}

// makeRoom applies the queue budgets to a new message of size bytes for a
// persistent session: its own (broker.max_queued_bytes) and all sessions'
// together (storage.max_queued_bytes). With drop_oldest it drops the
// oldest waiting QoS 1 messages to fit; with refuse, or with nothing
// droppable, it turns the new one away. The caller holds s.mu.
func (s *session) makeRoom(b *Broker, m *message, fx *effects) bool {
	over := func() bool {
		return s.pendingB+m.size > s.budget(b) ||
			b.store.QueuedBytes()+int64(fx.batch.Bytes()+m.storedSize()) > b.opts.MaxStoredBytes
	}
	for over() {
		i := -1
		if b.opts.QueuePolicy != storage.QueueRefuse {
			for j, p := range s.pending {
				if p.qos == 1 {
					i = j
					break
				}
			}
		}
		if i < 0 {
			b.stats.refused.Add(1)
			b.logDrop(s.id, "queue full: new message refused")
			return false
		}
		old := s.pending[i]
		s.pending = append(s.pending[:i], s.pending[i+1:]...)
		s.pendingB -= old.msg.size
		fx.batch.Dequeue(s.id, old.seq)
		b.stats.dropped.Add(1)
		b.logDrop(s.id, "queue full: oldest QoS 1 message dropped")
	}
	return true
}

// budget is the session's byte budget for pending messages: its
// client's, plus what was restored beyond it. The caller holds s.mu.
func (s *session) budget(b *Broker) int { return b.opts.MaxQueuedBytes + s.grace }

// shrinkGrace lowers the grace as delivery empties the queue, so that it
// never again admits more than the budget; a message dropped to make room
// leaves it as it is, so that one new message replaces one old one rather
// than emptying the queue. The caller holds s.mu.
func (s *session) shrinkGrace(b *Broker) {
	if s.grace > 0 {
		s.grace = min(s.grace, max(0, s.pendingB-b.opts.MaxQueuedBytes))
	}
}

// fill moves pending messages into the window while there is room,
// dropping those that expired while they waited; the caller holds s.mu.
func (s *session) fill() {
	if s.conn == nil {
		return
	}
	active := 0
	for _, f := range s.inflight {
		if !f.held {
			active++
		}
	}
	for _, f := range s.inflight {
		if f.held && f.awaiting == nil && active < s.window() {
			f.held = false
			f.sent = time.Now()
			s.resendFlight(f)
			active++
		}
	}
	now := time.Now().UnixNano()
	n := 0
	stored := s.persistent(s.b)
	var fx *effects
	var waits []*ticket // of promoted QoS 2 messages whose batch has not gone yet
	for n < len(s.pending) && len(s.inflight) < s.window() {
		d := s.pending[n]
		s.pending[n] = delivery{}
		s.pendingB -= d.msg.size
		s.shrinkGrace(s.b)
		n++
		if !stored {
			if !d.msg.expired(now) {
				s.send(d)
			}
			continue
		}
		if fx == nil {
			fx = &effects{}
		}
		if d.msg.expired(now) {
			delete(s.unstored, d.seq)
			fx.batch.Dequeue(s.id, d.seq)
			continue
		}
		if t := s.unstored[d.seq]; t != nil {
			delete(s.unstored, d.seq)
			if !slices.Contains(waits, t) {
				waits = append(waits, t)
			}
		}
		f := s.sendStored(s.b, d, fx)
		fx.batch.SetInflight(s.id, d.seq, f.pid, false)
	}
	if fx != nil {
		// The packet identifiers given to promoted messages; submitted
		// only, since the caller holds s.mu and a commit's callback
		// (releasing QoS 2 flights) takes it.
		if len(waits) > 0 {
			// Promoted QoS 2 messages wait also for the batches that
			// store them: once all have gone to storage, an empty
			// commit after them (batches are applied in order) releases
			// the flights. fx itself goes now, in order with the
			// session's other writes.
			rel := fx.release
			fx.release = nil
			left := atomic.Int32{}
			left.Store(int32(len(waits)) + 1)
			b := s.b
			release := func() {
				if left.Add(-1) == 0 {
					b.store.After(func(error) {
						fx.release = rel
						b.releaseFlights(fx)
					})
				}
			}
			for _, t := range waits {
				t.after(release)
			}
			defer release() // after fx's commit below: deferred calls run last first
		}
		defer s.b.commitLazy(fx)
	}
	if n > 0 {
		// Slice forward rather than copy the rest down: draining a long
		// queue one acknowledgement at a time must not cost its length
		// each time. The taken slots were cleared above, and the array is
		// dropped when append next grows it or the queue empties.
		s.pending = s.pending[n:]
		if len(s.pending) == 0 {
			s.pending = nil
		}
	}
}

// ack completes the flight with packet identifier pid at the given stage:
// PUBACK ends a QoS 1 flight, PUBREC moves a QoS 2 flight to waiting for
// PUBCOMP, PUBCOMP ends it. It reports whether a flight matched. A stored
// flight's move to waiting for PUBCOMP goes into fx, which the caller
// commits before it sends PUBREL.
func (s *session) ack(kind byte, pid uint16, failed bool, fx *effects) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.inflight {
		if f.pid != pid {
			continue
		}
		switch {
		case kind == packets.Puback && f.qos == 1,
			kind == packets.Pubcomp && f.qos == 2 && f.rec,
			// A PUBREC with an error reason ends the exchange [MQTT-4.3.3-4].
			kind == packets.Pubrec && f.qos == 2 && failed:
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			if f.seq != 0 {
				s.b.lazy(func(bt *storage.Batch) { bt.Dequeue(s.id, f.seq) })
			}
			s.fill()
			return true
		case kind == packets.Pubrec && f.qos == 2:
			f.rec = true
			f.msg = nil // never sent again once PUBREL is [MQTT-4.3.3-6]
			if f.seq != 0 {
				// Durable before PUBREL: a client that has PUBREL may
				// complete and forget the identifier, and a restart that
				// found the flight without its PUBREC would send the
				// PUBLISH again, to be delivered twice.
				fx.batch.SetInflight(s.id, f.seq, f.pid, true)
			}
			return true
		}
		return false
	}
	return false
}

// discard ends the flight with packet identifier pid whatever its stage:
// the message could not be sent and counts as delivered [MQTT-3.1.2-25].
func (s *session) discard(pid uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.inflight {
		if f.pid == pid {
			s.inflight = append(s.inflight[:i], s.inflight[i+1:]...)
			if f.seq != 0 {
				s.b.lazy(func(bt *storage.Batch) { bt.Dequeue(s.id, f.seq) })
			}
			s.fill()
			return
		}
	}
}

// resend writes everything in flight again after a reconnect, in the
// original order: PUBLISH with DUP set, or PUBREL for QoS 2 flights that
// got their PUBREC [MQTT-4.4.0-1]; then fills the window from pending.
// The caller holds s.mu.
func (s *session) resend() {
	now := time.Now()
	for i, f := range s.inflight {
		f.sent = now
		// A client that returns with a smaller receive maximum gets the
		// rest as acknowledgements make room [MQTT-4.9.0-1].
		f.held = i >= s.window()
		if !f.held && f.awaiting == nil {
			s.resendFlight(f)
		}
	}
	s.fill()
}

// resendFlight writes an unacknowledged flight again: PUBREL once PUBREC
// has come, else the PUBLISH with DUP set [MQTT-3.3.1-1].
func (s *session) resendFlight(f *flight) {
	if f.rec {
		s.conn.enqueueControl(pubrelPacket(f.pid, s.conn.v5))
		return
	}
	s.conn.enqueueMsg(f.delivery, f.pid, true)
}
