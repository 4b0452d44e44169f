package bridge

import (
	"errors"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// Drop reasons, as counted in Stats.
const (
	DropFull       = "full"        // the outbox was full and nothing older could make room
	DropOldest     = "oldest"      // dropped to make room for a newer message
	DropExpired    = "expired"     // older than max_outbox_age
	DropSuperseded = "superseded"  // a state message replaced by a newer one on its topic
	DropRefused    = "refused"     // an alarm refused while the outbox was full
	DropMemoryFull = "memory_full" // a memory-only QoS 0 message past its memory budget
	DropRejected   = "rejected"    // the upstream refused it (a reason code of 0x80 or more)
	DropTooLarge   = "too_large"   // larger than the upstream's maximum packet size
)

// memoryOnlyBytes bounds the memory-only QoS 0 queue: a minute of brisk
// telemetry, small beside a 512 MB board, dropped oldest first.
const memoryOnlyBytes = 1 << 20

// outbox is one bridge's queue. Entries live in storage (the bridge's
// outbox bucket) keyed by an ever-growing sequence number; in memory the
// outbox keeps only counters, the cursor of what was handed to the link,
// what is in flight, and the queued state-class topics.
type outbox struct {
	db   *storage.DB
	name string
	max  int64
	ttl  time.Duration

	mu       sync.Mutex
	nextSeq  uint64
	count    int
	bytes    int64
	sent     uint64                // highest sequence handed to the link
	inflight map[uint64]int        // sequence -> entry size, handed to the link and not yet acknowledged
	state    map[string]stateEntry // remote topic -> its queued state-class entry
	dropScan uint64                // entries at or below were examined for dropping
	dropped  map[string]uint64
	alarm    []bool // by route index: the routes of class alarm
	// gone holds entries deleted in a batch that may not be committed yet,
	// with when, so that scans (which see only committed entries) skip
	// them; they are forgotten once surely committed.
	gone      map[uint64]int64
	deletes   []uint64  // acknowledged entries not yet deleted in storage
	gapSeq    uint64    // the sequence number the sender waits for
	gapSince  time.Time // since when
	lastPut   time.Time // when the newest sequence number was given out
	goneOrder []goneAt  // the same entries, oldest first, for pruning

	memory      []memEntry // memory-only QoS 0 messages, oldest first
	memoryBytes int

	// dead counts the bridge's dead letters (see deadletter.go), which
	// change only under the bridge's dead.mu as well as mu.
	dead struct {
		count int
		bytes int64
		next  uint64 // the sequence of the next dead letter
		max   int64  // max_dead_letter_bytes
		moved uint64 // moved here since the start
	}

	wake chan struct{} // capacity 1: something new to send
}

type goneAt struct {
	seq uint64
	at  int64
}

type stateEntry struct {
	seq  uint64
	size int
}

type memEntry struct {
	topic   string
	payload []byte
	retain  bool
}

// goneFor is how long a deleted entry is remembered: far longer than the
// lazy commit delay (1 s), so that no scan sees it after it is forgotten.
const goneFor = 30 * time.Second

func newOutbox(db *storage.DB, name string, max int64, ttl time.Duration, routes []outRoute) (*outbox, error) {
	ob := &outbox{db: db, name: name, max: max, ttl: ttl, inflight: map[uint64]int{},
		state: map[string]stateEntry{}, dropped: map[string]uint64{}, gone: map[uint64]int64{}, wake: make(chan struct{}, 1)}
	for _, r := range routes {
		ob.alarm = append(ob.alarm, r.Class == ClassAlarm)
	}
	if db != nil {
		// Numbering starts again from what the file holds: nothing of
		// an earlier outbox of this name may apply to the new entries.
		var open storage.Batch
		open.OutboxOpen(name)
		db.CommitLazy(&open)
		info, err := db.OutboxInfo(name)
		var bad *storage.OutboxDecodeError
		if errors.As(err, &bad) {
			// A damaged entry cannot be sent; it must not block the rest.
			var b storage.Batch
			for _, seq := range bad.Seqs {
				b.OutboxDelete(name, seq)
			}
			if err := db.CommitWait(&b); err != nil {
				return nil, err
			}
			ob.dropped["corrupt"] = uint64(len(bad.Seqs))
		} else if err != nil {
			return nil, err
		}
		ob.count, ob.bytes, ob.nextSeq = info.Count, info.Bytes, info.LastSeq+1
		if info.Count > 0 {
			ob.sent = info.FirstSeq - 1
		} else {
			ob.sent = info.LastSeq
		}
	} else {
		ob.nextSeq = 1
	}
	return ob, nil
}

// configure applies changed budgets and route classes (a reload).
func (ob *outbox) configure(max int64, ttl time.Duration, maxDead int64, routes []outRoute) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	ob.max, ob.ttl, ob.dead.max = max, ttl, maxDead
	ob.alarm = ob.alarm[:0]
	for _, r := range routes {
		ob.alarm = append(ob.alarm, r.Class == ClassAlarm)
	}
}

func (ob *outbox) signal() {
	select {
	case ob.wake <- struct{}{}:
	default:
	}
}

// put queues one message for route r into batch. It reports false when
// the message is refused (an alarm while full).
func (ob *outbox) put(r *outRoute, remote string, payload []byte, retain bool, batch *storage.Batch, now time.Time) bool {
	if r.MemoryOnly || batch == nil {
		return ob.putMemory(remote, payload, retain)
	}
	e := storage.OutboxEntry{Route: uint16(r.index), Added: now.UnixNano(),
		Msg: storage.Message{Topic: remote, Payload: payload, QoS: byte(r.QoS), Retain: retain}}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if r.Class == ClassState {
		if old, ok := ob.state[remote]; ok {
			if _, flying := ob.inflight[old.seq]; !flying && old.seq > ob.sent {
				ob.remove(batch, old.seq, old.size, remote, DropSuperseded, now.UnixNano())
			}
		}
	}
	if !ob.admit(r, &e, batch) {
		if r.Class == ClassAlarm {
			ob.dropped[DropRefused]++
			return false
		}
		ob.dropped[DropFull]++
	}
	return true
}

// admit queues e for route r into batch under the next sequence, making
// room by dropping the oldest droppable entries when the outbox is full;
// it reports false, queueing nothing, when e does not fit even so. Called
// with mu held.
func (ob *outbox) admit(r *outRoute, e *storage.OutboxEntry, batch *storage.Batch) bool {
	size := e.Size()
	if ob.bytes+int64(size) > ob.max {
		ob.makeRoom(int64(size), batch)
	}
	if ob.bytes+int64(size) > ob.max {
		return false
	}
	e.Seq = ob.nextSeq
	ob.nextSeq++
	ob.lastPut = time.Now()
	batch.OutboxPut(ob.name, e)
	ob.count++
	ob.bytes += int64(size)
	if r.Class == ClassState {
		ob.state[e.Msg.Topic] = stateEntry{seq: e.Seq, size: size}
	}
	ob.signal()
	return true
}

// makeRoom drops the oldest droppable entries (telemetry and state, not in
// flight) until need bytes fit. Called with mu held.
func (ob *outbox) makeRoom(need int64, batch *storage.Batch) {
	now := time.Now().UnixNano()
	ob.pruneGone(now)
	_ = ob.db.OutboxScan(ob.name, ob.dropScan, 256, func(e *storage.OutboxEntry) bool {
		ob.dropScan = e.Seq
		if !ob.droppable(e) {
			return true
		}
		ob.remove(batch, e.Seq, e.Size(), e.Msg.Topic, DropOldest, now)
		return ob.bytes+need > ob.max
	})
}

// droppable reports whether a scanned entry may be dropped for room or age.
func (ob *outbox) droppable(e *storage.OutboxEntry) bool {
	if _, flying := ob.inflight[e.Seq]; flying {
		return false
	}
	if _, g := ob.gone[e.Seq]; g {
		return false
	}
	return !(int(e.Route) < len(ob.alarm) && ob.alarm[e.Route])
}

// remove deletes a queued entry in batch and counts it. Called with mu held.
func (ob *outbox) remove(batch *storage.Batch, seq uint64, size int, topic, reason string, now int64) {
	batch.OutboxDelete(ob.name, seq)
	ob.markGone(seq, now)
	ob.count--
	ob.bytes -= int64(size)
	ob.dropped[reason]++
	ob.forgetState(topic, seq)
}

func (ob *outbox) markGone(seq uint64, now int64) {
	ob.gone[seq] = now
	ob.goneOrder = append(ob.goneOrder, goneAt{seq, now})
	ob.pruneGone(now)
}

func (ob *outbox) pruneGone(now int64) {
	i := 0
	for ; i < len(ob.goneOrder) && now-ob.goneOrder[i].at > int64(goneFor); i++ {
		delete(ob.gone, ob.goneOrder[i].seq)
	}
	if i > 0 {
		ob.goneOrder = append(ob.goneOrder[:0], ob.goneOrder[i:]...)
	}
}

func (ob *outbox) forgetState(topic string, seq uint64) {
	if s, ok := ob.state[topic]; ok && s.seq == seq {
		delete(ob.state, topic)
	}
}

func (ob *outbox) putMemory(topic string, payload []byte, retain bool) bool {
	size := len(topic) + len(payload)
	ob.mu.Lock()
	defer ob.mu.Unlock()
	for ob.memoryBytes+size > memoryOnlyBytes && len(ob.memory) > 0 {
		old := ob.memory[0]
		ob.memory = ob.memory[1:]
		ob.memoryBytes -= len(old.topic) + len(old.payload)
		ob.dropped[DropMemoryFull]++
	}
	if size > memoryOnlyBytes {
		ob.dropped[DropMemoryFull]++
		return true
	}
	ob.memory = append(ob.memory, memEntry{topic: topic, payload: payload, retain: retain})
	ob.memoryBytes += size
	ob.signal()
	return true
}

// takeMemory removes and returns the memory-only messages queued.
func (ob *outbox) takeMemory() []memEntry {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	m := ob.memory
	ob.memory, ob.memoryBytes = nil, 0
	return m
}

// acked removes an entry the upstream acknowledged.
func (ob *outbox) acked(seq uint64, topic string, reason string) {
	ob.mu.Lock()
	size, ok := ob.inflight[seq]
	delete(ob.inflight, seq)
	if ok {
		ob.count--
		ob.bytes -= int64(size)
		ob.forgetState(topic, seq)
		if reason != "" {
			ob.dropped[reason]++
		}
	}
	if ok && ob.db != nil {
		ob.markGone(seq, time.Now().UnixNano())
		ob.deletes = append(ob.deletes, seq)
	}
	flush := len(ob.deletes) >= deleteBatch
	ob.mu.Unlock()
	if flush {
		ob.flushDeletes()
	}
}

// deleteBatch is how many acknowledged entries are deleted in one batch:
// one storage batch per acknowledgement would cost an allocation and a
// trip through the committer each, at tens of thousands a second.
const deleteBatch = 128

// flushDeletes deletes the acknowledged entries gathered so far, lazily: a
// crash before it is written sends them again, a duplicate at QoS 1 rather
// than an fsync per acknowledgement. The sender calls it when idle too.
func (ob *outbox) flushDeletes() {
	ob.mu.Lock()
	seqs := ob.deletes
	ob.deletes = nil
	ob.mu.Unlock()
	if len(seqs) == 0 || ob.db == nil {
		return
	}
	var b storage.Batch
	for _, seq := range seqs {
		b.OutboxDelete(ob.name, seq)
	}
	ob.db.CommitLazy(&b)
}

// rewind makes every entry in flight unsent again, after the link failed.
func (ob *outbox) rewind() {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	for seq := range ob.inflight {
		if seq-1 < ob.sent {
			ob.sent = seq - 1
		}
	}
	clear(ob.inflight)
	ob.dropScan = min(ob.dropScan, ob.sent)
	ob.signal()
}

// gapWait is how long the sender waits for a missing sequence number: an
// entry whose batch is not on disk yet (the publish that made it is still
// committing, or rides on a lazy commit within a second). A gap that
// outlasts it belonged to a batch that failed to commit, whose publisher
// was told so; the sender moves on.
const gapWait = 10 * time.Second

// next returns up to n entries after the cursor, in sequence order without
// gaps, and marks them in flight. Sequence numbers are given out before
// their batches commit, and batches can reach the disk out of that order:
// the cursor never passes a number that is neither on disk nor known gone,
// or that entry would never be sent.
func (ob *outbox) next(n int) []storage.OutboxEntry {
	ob.mu.Lock()
	after := ob.sent
	ob.mu.Unlock()
	var out []storage.OutboxEntry
	_ = ob.db.OutboxScan(ob.name, after, n, func(e *storage.OutboxEntry) bool {
		out = append(out, *e)
		return true
	})
	now := time.Now()
	ob.mu.Lock()
	defer ob.mu.Unlock()
	kept := out[:0]
	expect := ob.sent + 1
	waiting := false
	for _, e := range out {
		if e.Seq < expect {
			continue // rewound past, or dropped meanwhile
		}
		for expect < e.Seq {
			if _, g := ob.gone[expect]; !g {
				break
			}
			expect++
		}
		if e.Seq != expect {
			if ob.gapSeq != expect {
				ob.gapSeq, ob.gapSince = expect, now
			}
			if now.Sub(ob.gapSince) < gapWait {
				waiting = true
				break
			}
			ob.dropped["uncommitted"] += e.Seq - expect
		}
		if _, g := ob.gone[e.Seq]; g {
			expect = e.Seq + 1
			ob.sent = e.Seq
			continue
		}
		if _, flying := ob.inflight[e.Seq]; flying {
			// In flight already: resumed from before a restart, or left
			// behind by a cursor taken back for an earlier entry.
			expect = e.Seq + 1
			ob.sent = e.Seq
			continue
		}
		ob.inflight[e.Seq] = e.Size()
		ob.sent = e.Seq
		expect = e.Seq + 1
		kept = append(kept, e)
	}
	if !waiting && len(out) < n {
		// The scan read to the end. Numbers past it that are known gone
		// (dropped, acknowledged) will never be read: the cursor passes
		// them, or the sender would look for them forever. So does it
		// every number when the newest was given out longer than gapWait
		// ago: what is not on disk by now never will be.
		for expect < ob.nextSeq {
			if _, g := ob.gone[expect]; !g {
				break
			}
			ob.sent = expect
			expect++
		}
		if expect < ob.nextSeq && now.Sub(ob.lastPut) >= gapWait {
			ob.sent = ob.nextSeq - 1
		}
	}
	return kept
}

// resumeFlight marks entry seq, of size bytes, as in flight from before a
// restart: the cursor passes it by, and it is resumed or rewound with the
// first link.
func (ob *outbox) resumeFlight(seq uint64, size int) {
	ob.mu.Lock()
	ob.inflight[seq] = size
	ob.mu.Unlock()
}

// entry reads entry seq, or returns nil when it is not stored.
func (ob *outbox) entry(seq uint64) *storage.OutboxEntry {
	var e *storage.OutboxEntry
	if ob.db == nil || seq == 0 {
		return nil
	}
	_ = ob.db.OutboxScan(ob.name, seq-1, 1, func(got *storage.OutboxEntry) bool {
		if got.Seq == seq {
			e = got
		}
		return false
	})
	return e
}

// unsend takes back an entry handed to the link that the link did not
// take (its window was full, or it was closing): it is sent again.
func (ob *outbox) unsend(seq uint64) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	delete(ob.inflight, seq)
	if seq-1 < ob.sent {
		ob.sent = seq - 1
	}
	ob.signal()
}

// hasDeletes reports whether acknowledged entries wait for their delete.
func (ob *outbox) hasDeletes() bool {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return len(ob.deletes) > 0
}

// passed reports whether the cursor has passed entry seq and it is not in
// flight: it was acknowledged, or dropped, or never reached the disk.
func (ob *outbox) passed(seq uint64) bool {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	_, flying := ob.inflight[seq]
	return ob.sent >= seq && !flying
}

// pending reports whether entries wait behind the cursor.
func (ob *outbox) pending() bool {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.nextSeq-1 > ob.sent || len(ob.memory) > 0
}

// expire drops telemetry and state entries older than the TTL.
func (ob *outbox) expire(now time.Time) {
	if ob.db == nil {
		return
	}
	var b storage.Batch
	ob.mu.Lock()
	limit := now.Add(-ob.ttl).UnixNano()
	ob.pruneGone(now.UnixNano())
	_ = ob.db.OutboxScan(ob.name, 0, 0, func(e *storage.OutboxEntry) bool {
		if e.Added >= limit {
			return false
		}
		if ob.droppable(e) {
			ob.remove(&b, e.Seq, e.Size(), e.Msg.Topic, DropExpired, now.UnixNano())
		}
		return true
	})
	ob.mu.Unlock()
	if !b.Empty() {
		ob.db.CommitLazy(&b)
	}
}

// oldest returns when the oldest queued entry was added, or zero when
// nothing is queued. Acknowledged and dropped entries stay on disk until
// their lazy delete lands, a second or so: they are known gone and passed
// over, so that an empty outbox does not report the age of what it sent.
func (ob *outbox) oldest() time.Time {
	var t time.Time
	if ob.db == nil {
		return t
	}
	ob.mu.Lock()
	empty := ob.count == 0
	ob.mu.Unlock()
	if empty {
		return t
	}
	_ = ob.db.OutboxScan(ob.name, 0, 0, func(e *storage.OutboxEntry) bool {
		// The lock is taken per entry, not for the scan: a scan through
		// a burst's pending deletes must not hold up the publishers.
		ob.mu.Lock()
		_, gone := ob.gone[e.Seq]
		ob.mu.Unlock()
		if gone {
			return true
		}
		t = time.Unix(0, e.Added)
		return false
	})
	return t
}
