package bridge

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/storage"
)

// loadFlights takes up the QoS 2 messages that were in flight upstream
// when the gateway last stopped, to resume them on the first connection.
// Of two records holding one packet identifier, the older one's message
// completed before the identifier was taken again: its entry is done.
func (b *Bridge) loadFlights() error {
	db := b.opts.Store
	if db == nil {
		return nil
	}
	set, err := db.OutboxFlights(b.name)
	if err != nil {
		return err
	}
	b.loop.tracked = set.Tracked
	if set.Bad > 0 {
		b.log.Warn("QoS 2 flight records do not decode; their messages go again as new", "records", set.Bad)
	}
	live := map[uint16]storage.OutboxFlight{}
	var done []storage.OutboxFlight
	for _, f := range set.Flights {
		b.flights.stampAfter(f.Stamp)
		if old, ok := live[f.PID]; ok {
			if old.Stamp > f.Stamp {
				old, f = f, old
			}
			done = append(done, old)
		}
		live[f.PID] = f
	}
	var batch storage.Batch
	for _, f := range done {
		if size, topic, ok := b.entry(f.Seq); ok {
			b.ob.resumeFlight(f.Seq, size)
			b.ob.acked(f.Seq, topic, "")
		} else {
			batch.OutboxFlightDelete(b.name, f.Seq)
		}
	}
	for _, f := range live {
		size, _, ok := b.entry(f.Seq)
		if !ok {
			batch.OutboxFlightDelete(b.name, f.Seq) // its entry's delete came first
			continue
		}
		b.ob.resumeFlight(f.Seq, size)
		b.flights.track(&outFlight{seq: f.Seq, pid: f.PID, recorded: true, released: f.Released})
	}
	db.CommitLazy(&batch)
	b.ob.flushDeletes()
	if n := b.flights.len(); n > 0 {
		b.log.Info("QoS 2 messages in flight upstream at the last stop are resumed", "messages", n)
	}
	return nil
}

// entry reads outbox entry seq's size and topic.
func (b *Bridge) entry(seq uint64) (size int, topic string, ok bool) {
	e := b.ob.entry(seq)
	if e == nil {
		return 0, "", false
	}
	return e.Size(), e.Msg.Topic, true
}

// resume deals with what was in flight on the last link: with the session
// present upstream it is sent again under its packet identifiers (PUBREL
// for a QoS 2 message past PUBREC); without, the outbox cursor goes back
// and it is sent as new. With probe set (the entry the last links ended
// on, see suspect.go) and the session present, they wait in lk.held,
// their identifiers claimed: the send loop sends probe's first, alone,
// once the link has shown it answers, and the others once the probe is
// through. It reports false when the link failed meanwhile.
func (b *Bridge) resume(lk *linkRun, probe uint64) bool {
	c := lk.c
	flights := b.flights.takeAll()
	if len(flights) == 0 {
		return true
	}
	if !c.Info().SessionPresent {
		// The server kept nothing of ours: the records describe nothing.
		// Their deletes go ahead of any record made for the new session.
		if db := b.opts.Store; db != nil {
			var batch storage.Batch
			for seq, f := range flights {
				if f.recorded || f.released {
					batch.OutboxFlightDelete(b.name, seq)
				}
			}
			db.CommitLazy(&batch)
		}
		b.ob.rewind()
		return true
	}
	seqs := make([]uint64, 0, len(flights))
	for seq := range flights {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	entries := make(map[uint64]*storage.OutboxEntry, len(seqs))
	var batch storage.Batch
	var released, recorded []*outFlight
	for _, seq := range seqs {
		f := flights[seq]
		e := b.ob.entry(seq)
		if e == nil {
			continue // acknowledged after all (its delete is on disk)
		}
		entries[seq] = e
		if b.opts.Store == nil {
			f.released = f.released || f.recd
			continue
		}
		// Nothing of QoS 2 goes out before its record is on disk.
		switch {
		case f.recd && !f.released:
			batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: seq, PID: f.pid, Released: true, Stamp: b.flights.nextStamp()})
			released = append(released, f)
		case f.pid != 0 && !f.released && !f.recorded && b.sendQoS(e.Msg.QoS) == 2:
			batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: seq, PID: f.pid, Stamp: b.flights.nextStamp()})
			recorded = append(recorded, f)
		}
	}
	if !batch.Empty() {
		if err := b.opts.Store.CommitWait(&batch); err != nil {
			b.recordFailed("recording QoS 2 messages in flight failed; the link is closed to try again", err)
			b.flights.restore(flights)
			return false
		}
		for _, f := range released {
			f.released = true
		}
		for _, f := range recorded {
			f.recorded = true
		}
	}
	if f := flights[probe]; f != nil && entries[probe] != nil {
		var now []uint64
		var claim []uint16
		held := map[uint64]*outFlight{}
		for _, seq := range seqs {
			f := flights[seq]
			if f.pid == 0 || entries[seq] == nil {
				now = append(now, seq)
				continue
			}
			held[seq] = f
			claim = append(claim, f.pid)
		}
		if err := c.Claim(claim); err != nil {
			b.flights.restore(flights)
			return false
		}
		lk.held, seqs = held, now
	}
	return b.resend(c, seqs, flights, entries)
}

// resendHeld sends the flights that wait in lk.held: the probe's alone
// when it is one of them, the others once the probe is through.
func (b *Bridge) resendHeld(lk *linkRun) bool {
	held := lk.held
	if f := held[lk.probe]; f != nil {
		delete(held, lk.probe)
		held = map[uint64]*outFlight{lk.probe: f}
	} else {
		lk.held = nil
	}
	if len(held) == 0 {
		return true
	}
	seqs := make([]uint64, 0, len(held))
	entries := make(map[uint64]*storage.OutboxEntry, len(held))
	for seq := range held {
		seqs = append(seqs, seq)
		entries[seq] = b.ob.entry(seq)
	}
	slices.Sort(seqs)
	return b.resend(lk.c, seqs, held, entries)
}

// resend sends flights seqs of a resumed session again under their
// packet identifiers, in order: PUBREL for one past PUBREC, the PUBLISH
// with DUP otherwise; one that never had an identifier goes back to the
// outbox as new. It reports false, giving the rest back to the flight
// table, when the link failed meanwhile.
func (b *Bridge) resend(c *mqttclient.Client, seqs []uint64, flights map[uint64]*outFlight, entries map[uint64]*storage.OutboxEntry) bool {
	for i, seq := range seqs {
		f, e := flights[seq], entries[seq]
		if e == nil {
			if f.pid != 0 {
				c.CancelID(f.pid) // a claim nothing will use
			}
			continue
		}
		var err error
		switch {
		case f.pid == 0:
			// It never had an identifier (QoS 0, or the link went
			// before it was written): it goes as new, in its turn.
			b.ob.unsend(seq)
			continue
		case f.released:
			f.link = b.loop.link
			b.flights.track(f)
			done := b.done(seq, e.Msg.Topic, 2)
			err = c.Release(f.pid, func(err error, reason byte) {
				if reason == packets.ErrPacketIdentifierNotFound.Code {
					// The server completed it before: the PUBCOMP that
					// said so was lost, or its outbox delete was.
					reason = 0
				}
				done(err, reason)
			})
		default:
			err = b.send1(c, e, f.pid, true)
		}
		if err != nil {
			b.log.Warn("resending after a reconnect failed", "err", err)
			rest := map[uint64]*outFlight{}
			for _, s := range seqs[i:] {
				rest[s] = flights[s]
			}
			b.flights.restore(rest)
			return false
		}
		b.shared.mu.Lock()
		b.shared.resumed++
		b.shared.mu.Unlock()
	}
	return true
}

// sendQoS is the QoS an entry queued at q goes at on the current link:
// no more than the server's Maximum QoS and what was learned allow.
func (b *Bridge) sendQoS(q byte) byte { return min(q, b.loop.maxQoS) }

// prepare takes packet identifiers for the entries that go out at QoS 2
// and records them, durably, before any of them is sent. It returns the
// identifiers (0: the client picks one) and how many entries may go: all
// of them but those the window or a failed record left out.
func (b *Bridge) prepare(c *mqttclient.Client, entries []storage.OutboxEntry) (pids []uint16, ready int) {
	pids = make([]uint16, len(entries))
	db := b.opts.Store
	if db == nil {
		return pids, len(entries)
	}
	ready = len(entries)
	var batch storage.Batch
	for i := range entries {
		e := &entries[i]
		if b.sendQoS(e.Msg.QoS) < 2 {
			continue
		}
		pid, err := c.ReserveID()
		if err != nil {
			ready = i
			break
		}
		pids[i] = pid
		batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: e.Seq, PID: pid, Stamp: b.flights.nextStamp()})
	}
	if batch.Empty() {
		return pids, ready
	}
	if err := db.CommitWait(&batch); err != nil {
		b.recordFailed("recording QoS 2 messages before sending them failed; they wait", err)
		return pids, 0
	}
	return pids, ready
}

// unprepare takes back entries handed out by next that were not sent:
// their reserved identifiers are given back and their records deleted
// (ahead of any later record, which may reuse an identifier), and they
// go again in their turn.
func (b *Bridge) unprepare(c *mqttclient.Client, entries []storage.OutboxEntry, pids []uint16) {
	var batch storage.Batch
	for i, e := range entries {
		if pids[i] != 0 {
			c.CancelID(pids[i])
			batch.OutboxFlightDelete(b.name, e.Seq)
		}
		b.ob.unsend(e.Seq)
	}
	if db := b.opts.Store; db != nil {
		db.CommitLazy(&batch)
	}
}

// recordWarnEvery spaces the warnings of a failing QoS 2 record, which is
// retried every second while the disk is full.
const recordWarnEvery = 30 * time.Second

// recordFailed holds the sender back for a second after a QoS 2 record
// failed, and says so, at most once per recordWarnEvery.
func (b *Bridge) recordFailed(msg string, err error) {
	now := time.Now()
	b.loop.recordHold = now.Add(time.Second)
	if now.Sub(b.loop.recordWarned) >= recordWarnEvery {
		b.loop.recordWarned = now
		b.log.Warn(msg, "err", err)
	}
}

// release records the PUBRECs that came since the last call as released,
// in one commit, then sends their PUBRELs.
func (b *Bridge) release(c *mqttclient.Client) {
	r := b.flights.takeReceipts()
	for _, pid := range r.strays {
		_ = c.ReleaseHeld(pid) // no record to keep: never hold a flight for good
	}
	if len(r.flights) == 0 {
		return
	}
	var batch storage.Batch
	for i := range r.records {
		batch.OutboxFlightPut(b.name, &r.records[i])
	}
	if err := b.opts.Store.CommitWait(&batch); err != nil {
		b.recordFailed("recording QoS 2 receipts failed; their PUBRELs wait", err)
		b.flights.requeue(r.pids)
		return
	}
	b.flights.markReleased(r.flights)
	for _, f := range r.flights {
		// An error means the link ended: the teardown reports the flight
		// as past PUBREC, and the next link sends the PUBREL.
		_ = c.ReleaseHeld(f.pid)
	}
}

// done is the completion of entry seq upstream, sent at qos.
func (b *Bridge) done(seq uint64, topic string, qos byte) func(error, byte) {
	return func(err error, reason byte) {
		if err != nil {
			if errors.Is(err, mqttclient.ErrReleasePending) {
				b.flights.markRecd(seq)
			}
			return // the link failed; resume or rewind deals with it
		}
		why := ""
		if reason >= 0x80 {
			if b.opts.Store != nil {
				// Kept as a dead letter, to be retried or dropped by a
				// person, once the run goroutine has moved it.
				b.flights.untrack(seq)
				b.progress.Add(1)
				b.refused.mu.Lock()
				b.refused.list = append(b.refused.list, refusal{seq: seq, topic: topic, reason: reason})
				b.refused.mu.Unlock()
				b.ob.signal()
				return
			}
			why = DropRejected
			b.log.Warn("upstream refused a message; with no state file to keep it in, it is dropped", "topic", topic, "reason", fmt.Sprintf("0x%02X", reason))
		}
		b.flights.untrack(seq)
		if qos > 0 {
			b.progress.Add(1) // an answer of the server's, not a write of ours
		}
		b.shared.mu.Lock()
		b.shared.acked++
		if qos == 2 && reason < 0x80 {
			b.shared.learned.qos2Taken = true
		}
		b.shared.mu.Unlock()
		b.ob.acked(seq, topic, why)
		b.ob.signal()
	}
}

// send1 publishes one outbox entry under pid (0: the client picks one);
// dup marks a resend under the identifier it had.
func (b *Bridge) send1(c *mqttclient.Client, e *storage.OutboxEntry, pid uint16, dup bool) error {
	seq, topic := e.Seq, e.Msg.Topic
	qos := min(b.sendQoS(e.Msg.QoS), c.Info().MaxQoS)
	m := &mqttclient.Outgoing{Topic: topic, Payload: e.Msg.Payload, QoS: qos, Retain: e.Msg.Retain, PacketID: pid, Dup: dup}
	f := &outFlight{seq: seq, pid: pid, link: b.loop.link, recorded: pid != 0 && b.opts.Store != nil && qos == 2}
	b.flights.track(f) // before Publish: its completion may come at once
	got, err := c.Publish(m, b.done(seq, topic, qos))
	switch {
	case err == nil:
		b.flights.setPID(f, got)
		b.shared.mu.Lock()
		b.shared.sent++
		b.shared.mu.Unlock()
		return nil
	case errors.Is(err, mqttclient.ErrTooLarge):
		// The server will never take it: retrying would stop the route.
		b.flights.untrack(seq)
		c.CancelID(pid)
		b.log.Warn("message larger than the upstream accepts; it is dropped", "topic", topic, "bytes", len(e.Msg.Payload))
		b.ob.acked(seq, topic, DropTooLarge)
		return nil
	default:
		b.flights.untrack(seq)
		return err
	}
}

// refusal is an outbox entry the upstream refused in its acknowledgement.
type refusal struct {
	seq    uint64
	topic  string
	reason byte
}

// moveRefused moves the entries the upstream refused in their
// acknowledgements to the dead letters. The run goroutine calls it: in
// the send loop, and when a link has ended, before the next one rewinds
// the outbox. An entry that cannot be moved (the disk failing) is
// counted as rejected and dropped, and said so: never silently.
func (b *Bridge) moveRefused() {
	b.refused.mu.Lock()
	list := b.refused.list
	b.refused.list = nil
	b.refused.mu.Unlock()
	for _, r := range list {
		why := fmt.Sprintf("the upstream refused it: %s (0x%02X)", mqttwire.ReasonName(r.reason), r.reason)
		e := b.ob.entry(r.seq)
		if e == nil {
			continue // gone meanwhile (expired, or dropped by a command)
		}
		err := b.deadLetterAfter(*e, why, 1)
		if err == nil {
			continue
		}
		b.log.Error("upstream refused a message and moving it to the dead letters failed; it is dropped", "topic", r.topic, "reason", why, "err", err)
		b.ob.acked(r.seq, r.topic, DropRejected)
	}
}
