package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Batch collects writes that become durable together. Its methods encode
// the records at once, so a Batch holds no reference to its arguments.
// The zero Batch is empty and ready to use.
type Batch struct {
	ops   []op
	bytes int // record bytes it writes, for the budgets

	arena  []byte // what the outbox writes encode their keys and records into
	bridge []byte // the bridge name the last outbox write used, in arena

	guards []opGuard // in the order of their writes
}

type opKind uint8

const (
	opPut opKind = iota
	opDelete
	opDeletePrefix
	opPatchQueued // rewrite a queue record's packet identifier and flags
	opOutboxPut   // put into the bucket sub of bucket (outbox, upflight, deadletter), creating it
	opOutboxDelete
	opOutboxDrop // delete the bucket sub of the outbox bucket
	opOutboxOpen // create the bucket sub of bucket if it is not there
	// put a retained message, and its owner record sub (nil for none) in
	// bucketRetainedBy; one write, so that one guard covers both
	opRetainedPut
)

type op struct {
	kind   opKind
	bucket []byte
	sub    []byte // the outbox ops' bridge: the bucket nested in bucket
	key    []byte
	val    []byte
}

// opGuard makes the batch's write at index op conditional: it applies
// only if no write of a change numbered want or later has (see
// GuardLast). Kept beside the writes, which are many, rather than in them.
type opGuard struct {
	op   int
	v    *atomic.Uint64
	want uint64
}

// maxArenaChunk bounds the chunks a batch's arena grows by. Chunks double
// from the first record's size, so a batch of one publish allocates once
// and exactly, and one of thousands (a bridge catching up) a few times;
// the bound keeps the unused tail of the last chunk small.
const maxArenaChunk = 64 << 10

// reserve returns n bytes of the batch's arena. Records are encoded in
// place and never written again: the ops keep referring to them, and
// bbolt reads them until its transaction commits.
func (b *Batch) reserve(n int) []byte {
	if cap(b.arena)-len(b.arena) < n {
		b.arena = make([]byte, 0, max(n, min(2*cap(b.arena), maxArenaChunk)))
	}
	l := len(b.arena)
	b.arena = b.arena[:l+n]
	return b.arena[l : l+n : l+n]
}

// reserveOutbox reserves n bytes for an outbox write's key and record,
// and returns them with the bridge's name as bytes: copied into the arena,
// in the same reservation, once for a run of writes to the same outbox.
func (b *Batch) reserveOutbox(bridge string, n int) (name, buf []byte) {
	if b.bridge != nil && string(b.bridge) == bridge {
		return b.bridge, b.reserve(n)
	}
	buf = b.reserve(len(bridge) + n)
	b.bridge = buf[:len(bridge):len(bridge)]
	copy(b.bridge, bridge)
	return b.bridge, buf[len(bridge):]
}

// Empty reports whether the batch writes nothing.
func (b *Batch) Empty() bool { return b == nil || len(b.ops) == 0 }

// Len returns the number of writes in the batch.
func (b *Batch) Len() int { return len(b.ops) }

func (b *Batch) put(bucket, key, val []byte) {
	b.ops = append(b.ops, op{kind: opPut, bucket: bucket, key: key, val: val})
	b.bytes += len(key) + len(val)
}

func (b *Batch) del(bucket, key []byte) {
	b.ops = append(b.ops, op{kind: opDelete, bucket: bucket, key: key})
}

// SetRetained stores m as the retained message of its topic, set by no
// user (the gateway itself).
func (b *Batch) SetRetained(m *Message) {
	b.setRetained(m, nil)
}

// SetRetainedBy stores m as the retained message of its topic, set by
// user (which may be empty: an anonymous client), so that the broker can
// count each user's retained messages again after a restart.
func (b *Batch) SetRetainedBy(m *Message, user string) {
	b.setRetained(m, append([]byte{'u'}, user...))
}

func (b *Batch) setRetained(m *Message, owner []byte) {
	val := appendMessage(nil, m)
	b.ops = append(b.ops, op{kind: opRetainedPut, bucket: bucketRetained, key: []byte(m.Topic), val: val, sub: owner})
	b.bytes += len(m.Topic) + len(val)
}

// DropLast takes the batch's last write back, with its guard: a write
// built before its writer could decide to make it.
func (b *Batch) DropLast() {
	n := len(b.ops)
	if n == 0 {
		return
	}
	o := &b.ops[n-1]
	if o.kind == opPut || o.kind == opRetainedPut {
		b.bytes -= len(o.key) + len(o.val)
	}
	b.ops[n-1] = op{}
	b.ops = b.ops[:n-1]
	if k := len(b.guards); k > 0 && b.guards[k-1].op == n-1 {
		b.guards = b.guards[:k-1]
	}
}

// DeleteRetained removes the retained message of topic, and its owner.
func (b *Batch) DeleteRetained(topic string) {
	b.del(bucketRetained, []byte(topic))
}

// PutSession stores a session's own record (not its subscriptions or queue).
func (b *Batch) PutSession(s *Session) {
	b.put(bucketSessions, []byte(s.ClientID), appendSession(nil, s))
}

// DeleteSession removes a session and everything it holds.
func (b *Batch) DeleteSession(clientID string) {
	b.del(bucketSessions, []byte(clientID))
	p := sessionPrefix(clientID)
	for _, bk := range [][]byte{bucketSubs, bucketQueue, bucketRel} {
		b.ops = append(b.ops, op{kind: opDeletePrefix, bucket: bk, key: p})
	}
}

// PutSub stores (or replaces) a subscription of a session.
func (b *Batch) PutSub(clientID string, s Sub) {
	v := []byte{s.Opts}
	v = binary.BigEndian.AppendUint32(v, s.ID)
	b.put(bucketSubs, subKey(clientID, s.Filter), v)
}

// DeleteSub removes a subscription of a session.
func (b *Batch) DeleteSub(clientID, filter string) {
	b.del(bucketSubs, subKey(clientID, filter))
}

// Enqueue stores a QoS 1/2 message for a session under seq, which orders
// the session's queue.
func (b *Batch) Enqueue(clientID string, q *Queued) {
	b.put(bucketQueue, queueKey(clientID, q.Seq), appendQueued(nil, q))
}

// SetInflight records the packet identifier a queued message was sent
// with, and whether its PUBREC has come.
func (b *Batch) SetInflight(clientID string, seq uint64, pid uint16, rec bool) {
	v := binary.BigEndian.AppendUint16(nil, pid)
	if rec {
		v = append(v, 1)
	} else {
		v = append(v, 0)
	}
	b.ops = append(b.ops, op{kind: opPatchQueued, bucket: bucketQueue, key: queueKey(clientID, seq), val: v})
}

// Dequeue removes a queued message: it was acknowledged, expired or dropped.
func (b *Batch) Dequeue(clientID string, seq uint64) {
	b.del(bucketQueue, queueKey(clientID, seq))
}

// AddAwaitingRel records an inbound QoS 2 packet identifier whose PUBREL
// has not come: a resent PUBLISH with it must not be delivered again.
func (b *Batch) AddAwaitingRel(clientID string, pid uint16) {
	b.put(bucketRel, relKey(clientID, pid), nil)
}

// DeleteAwaitingRel forgets an inbound QoS 2 packet identifier on PUBREL.
func (b *Batch) DeleteAwaitingRel(clientID string, pid uint16) {
	b.del(bucketRel, relKey(clientID, pid))
}

// ErrInvalidWrite is what a commit reports for a batch bbolt cannot store:
// a put with an empty key, or a key longer than bbolt's 32 KiB limit,
// which MQTT's 65535-byte topics and client ids can exceed.
var ErrInvalidWrite = errors.New("storage: write bbolt cannot store")

// validate refuses a batch that bbolt would fail on before it joins a
// transaction: grouped with others, it would fail every batch in the group.
func (b *Batch) validate() error {
	for i := range b.ops {
		o := &b.ops[i]
		switch o.kind {
		case opPut, opRetainedPut:
			if len(o.key) == 0 || len(o.key) > bolt.MaxKeySize {
				return fmt.Errorf("%w: %s key of %d bytes, bbolt takes 1 to %d", ErrInvalidWrite, o.bucket, len(o.key), bolt.MaxKeySize)
			}
		case opOutboxPut, opOutboxDelete, opOutboxDrop, opOutboxOpen:
			// An empty name is a caller's bug whichever the write; bbolt
			// would refuse to create its bucket.
			if len(o.sub) == 0 || len(o.sub) > bolt.MaxKeySize {
				return fmt.Errorf("%w: outbox of a bridge named with %d bytes, bbolt takes 1 to %d", ErrInvalidWrite, len(o.sub), bolt.MaxKeySize)
			}
			if o.kind == opOutboxPut && binary.BigEndian.Uint64(o.key) == 0 {
				return fmt.Errorf("%w: %s record of bridge %q with sequence 0; sequences start at 1, and a scan from the start passes 0 by", ErrInvalidWrite, o.bucket, o.sub)
			}
		default:
			continue // deletes of an impossible key find nothing
		}
		if int64(len(o.val)) > bolt.MaxValueSize {
			return fmt.Errorf("%w: %s record of %d bytes, bbolt takes up to %d", ErrInvalidWrite, o.bucket, len(o.val), bolt.MaxValueSize)
		}
	}
	return nil
}

// GuardLast makes the batch's last write conditional: it applies only if
// no write guarded by v with a change numbered change or later has been
// applied. The committer keeps in v the highest change applied, restored
// if its transaction fails. Writers that number their changes of one key
// thus keep the latest change in the file when their batches reach the
// committer out of order, and an earlier change is never skipped for a
// later one that is not yet in the file.
func (b *Batch) GuardLast(v *atomic.Uint64, change uint64) {
	if n := len(b.ops); n > 0 {
		if k := len(b.guards); k > 0 && b.guards[k-1].op == n-1 {
			b.guards[k-1] = opGuard{n - 1, v, change}
			return
		}
		b.guards = append(b.guards, opGuard{n - 1, v, change})
	}
}

// Append adds other's writes after b's.
func (b *Batch) Append(other *Batch) {
	if other == nil {
		return
	}
	for _, g := range other.guards {
		g.op += len(b.ops)
		b.guards = append(b.guards, g)
	}
	b.ops = append(b.ops, other.ops...)
	b.bytes += other.bytes
}

// pending is a batch waiting for the committer.
type pending struct {
	b    *Batch
	done func(error) // nil for a lazy batch
}

// Commit applies b durably, grouped with whatever else is waiting, and
// calls done (on the committer's goroutine; it must not block) once it is
// fsynced or has failed. An empty batch completes at once.
func (db *DB) Commit(b *Batch, done func(error)) {
	if b.Empty() {
		if done != nil {
			done(nil)
		}
		return
	}
	if done == nil {
		done = func(error) {}
	}
	if err := b.validate(); err != nil {
		done(err)
		return
	}
	db.submit(pending{b: b, done: done})
}

// After calls done once every batch committed before it has been applied
// (or has failed), without a transaction of its own: it keeps a caller's
// completions in order when some of its steps write nothing.
func (db *DB) After(done func(error)) {
	db.submit(pending{b: &Batch{}, done: done})
}

// Bytes returns the record bytes the batch writes.
func (b *Batch) Bytes() int {
	if b == nil {
		return 0
	}
	return b.bytes
}

// CommitWait is Commit for a caller that waits for the result.
func (db *DB) CommitWait(b *Batch) error {
	ch := make(chan error, 1)
	db.Commit(b, func(err error) { ch <- err })
	return <-ch
}

// CommitLazy applies b with the next commit, or within LazyDelay, without
// an fsync of its own. Its failure is counted and logged, not reported.
func (db *DB) CommitLazy(b *Batch) {
	if b.Empty() {
		return
	}
	if err := b.validate(); err != nil {
		db.stats.lazyLost.Add(1)
		db.logError("state database refused a write", err)
		return
	}
	db.submit(pending{b: b})
}

func (db *DB) submit(p pending) {
	db.qmu.Lock()
	if db.closed {
		db.qmu.Unlock()
		if p.done != nil {
			// Never on the caller's goroutine: callers may hold locks
			// their callbacks take.
			go p.done(ErrClosed)
		}
		return
	}
	db.queue = append(db.queue, p)
	if p.done != nil {
		db.durable++
	}
	db.qmu.Unlock()
	select {
	case db.wake <- struct{}{}:
	default:
	}
}

// commitLoop is the committer goroutine: it takes everything waiting and
// applies it in one transaction. A durable batch starts a commit at once;
// lazy ones wait up to LazyDelay for company.
func (db *DB) commitLoop() {
	defer close(db.loopDone)
	var lazySince time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-db.wake:
		case <-timer.C:
		case <-db.stop:
			db.flush()
			return
		}
		db.qmu.Lock()
		n, durable := len(db.queue), db.durable
		db.qmu.Unlock()
		if n == 0 {
			continue
		}
		if durable == 0 {
			if lazySince.IsZero() {
				lazySince = time.Now()
			}
			if wait := db.lazyDelay - time.Since(lazySince); wait > 0 {
				timer.Reset(wait)
				continue
			}
		}
		lazySince = time.Time{}
		timer.Stop()
		db.flush()
	}
}

// flush commits everything waiting, in one transaction.
func (db *DB) flush() {
	db.qmu.Lock()
	batch := db.queue
	db.queue, db.spare = db.spare[:0], nil
	db.durable = 0
	db.qmu.Unlock()
	if len(batch) == 0 {
		return
	}
	ops := 0
	for i := range batch {
		ops += len(batch[i].b.ops)
	}
	var err error
	if ops > 0 {
		start := time.Now()
		err = db.apply(batch)
		db.noteCommit(len(batch), time.Since(start), err)
		db.sweepEarly(start)
	}
	for i := range batch {
		if batch[i].done != nil {
			batch[i].done(err)
		} else if err != nil {
			db.stats.lazyLost.Add(1)
		}
		batch[i] = pending{}
	}
	db.qmu.Lock()
	db.spare = batch[:0]
	db.qmu.Unlock()
}

// apply runs every batch in one bbolt transaction and commits it, which
// fsyncs the file.
func (db *DB) apply(batch []pending) error {
	var delta int64
	err := guard("commit", func() error {
		tx, err := db.bolt.Begin(true)
		if err != nil {
			return fmt.Errorf("storage: begin: %w", err)
		}
		// After a panic (a damaged page) the writer lock must still go.
		defer func() {
			if tx.DB() != nil {
				_ = tx.Rollback()
			}
		}()
		for _, p := range batch {
			guards := p.b.guards
			for i := range p.b.ops {
				if len(guards) > 0 && guards[0].op == i {
					g := guards[0]
					guards = guards[1:]
					was := g.v.Load()
					if was >= g.want {
						continue // a later change of the key is in the file
					}
					db.undo = append(db.undo, undo{guard: g.v, was: was})
					g.v.Store(g.want)
				}
				d, err := db.applyOp(tx, &p.b.ops[i])
				if err != nil {
					return err
				}
				delta += d
			}
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("storage: commit: %w", err)
		}
		return nil
	})
	if err != nil {
		db.rollbackEarly()
		return err
	}
	db.undo = db.undo[:0]
	db.queuedBytes.Add(delta)
	return nil
}

// applyOp applies one write and returns how it changed the bytes held in
// the queue bucket.
func (db *DB) applyOp(tx *bolt.Tx, o *op) (int64, error) {
	bk := tx.Bucket(o.bucket)
	if bk == nil {
		return 0, fmt.Errorf("storage: bucket %q missing", o.bucket)
	}
	queue := bytes.Equal(o.bucket, bucketQueue)
	var delta int64
	switch o.kind {
	case opOutboxPut:
		if db.tookEarly(o) != nil {
			return 0, nil // deleted before it arrived: superseded or dropped for room
		}
		// Damage can leave a record where a bucket belongs or the other
		// way round, which Check and scans report. A put replaces it:
		// failing would fail every commit grouped with this one, and the
		// next, for as long as the bridge keeps queueing.
		// bbolt keeps the buckets a transaction opened: one lookup serves
		// every put of a group commit.
		nb, err := bk.CreateBucketIfNotExists(o.sub)
		if errors.Is(err, berrors.ErrIncompatibleValue) {
			if err = bk.Delete(o.sub); err == nil {
				nb, err = bk.CreateBucket(o.sub)
			}
		}
		if err != nil {
			return 0, fmt.Errorf("storage: outbox of bridge %q: %w", o.sub, err)
		}
		err = nb.Put(o.key, o.val)
		if errors.Is(err, berrors.ErrIncompatibleValue) {
			if err = nb.DeleteBucket(o.key); err == nil {
				err = nb.Put(o.key, o.val)
			}
		}
		return 0, err
	case opOutboxOpen:
		db.forgetEarly(o)
		_, err := bk.CreateBucketIfNotExists(o.sub)
		if errors.Is(err, berrors.ErrIncompatibleValue) {
			if err = bk.Delete(o.sub); err == nil {
				_, err = bk.CreateBucket(o.sub)
			}
		}
		return 0, err
	case opOutboxDelete:
		nb := bk.Bucket(o.sub)
		if nb == nil || nb.Get(o.key) == nil && nb.Bucket(o.key) == nil {
			db.noteEarly(o, nil)
		}
		if nb == nil {
			return 0, nil
		}
		err := nb.Delete(o.key)
		if errors.Is(err, berrors.ErrIncompatibleValue) {
			// A bucket under an entry's key, which only damage makes
			// and which a scan reports as an entry that does not
			// decode: deleting it is what the bridge asked for.
			err = nb.DeleteBucket(o.key)
		}
		if err == nil && bytes.Equal(o.bucket, bucketOutbox) {
			err = deleteUpflight(tx, o.sub, o.key)
		}
		return 0, err
	case opOutboxDrop:
		db.forgetEarly(o)
		if bytes.Equal(o.bucket, bucketOutbox) {
			if err := dropUpflight(tx, o.sub); err != nil {
				return 0, err
			}
		}
		err := bk.DeleteBucket(o.sub)
		switch {
		case errors.Is(err, berrors.ErrBucketNotFound):
			return 0, nil
		case errors.Is(err, berrors.ErrIncompatibleValue):
			// A record where the bucket should be, which Check reports:
			// dropping the outbox is the way to be rid of it.
			return 0, bk.Delete(o.sub)
		}
		return 0, err
	case opPut:
		val := o.val
		if queue {
			if e := db.tookEarly(o); e != nil {
				if e.deleted {
					return 0, nil // acknowledged, or dropped, before it arrived
				}
				if len(val) >= 3 {
					val = append(append([]byte(nil), e.patch...), val[3:]...)
				}
			}
			delta -= int64(len(bk.Get(o.key)))
			delta += int64(len(val))
		}
		return delta, bk.Put(o.key, val)
	case opRetainedPut:
		if err := bk.Put(o.key, o.val); err != nil {
			return 0, err
		}
		return 0, putOwner(tx, o.key, o.sub)
	case opDelete:
		if queue {
			old := bk.Get(o.key)
			if old == nil {
				db.noteEarly(o, nil)
			}
			delta -= int64(len(old))
		}
		if bytes.Equal(o.bucket, bucketRetained) {
			if err := putOwner(tx, o.key, nil); err != nil {
				return 0, err
			}
		}
		return delta, bk.Delete(o.key)
	case opDeletePrefix:
		// Keys first, deletes after: a cursor's position after a delete
		// is not something to rely on.
		var keys [][]byte
		c := bk.Cursor()
		for k, v := c.Seek(o.key); k != nil && bytes.HasPrefix(k, o.key); k, v = c.Next() {
			keys = append(keys, bytes.Clone(k))
			if queue {
				delta -= int64(len(v))
			}
		}
		for _, k := range keys {
			if err := bk.Delete(k); err != nil {
				return delta, err
			}
		}
		if queue {
			// A session that starts again numbers its queue from 1.
			db.forgetEarly(o)
		}
		return delta, nil
	case opPatchQueued:
		old := bk.Get(o.key)
		if old == nil {
			// Not there yet, or gone already (acknowledged and
			// dequeued): kept for the record in case it is still to come.
			db.noteEarly(o, o.val)
			return 0, nil
		}
		if len(old) < 3 {
			return 0, nil
		}
		v := append(append([]byte(nil), o.val...), old[3:]...)
		return 0, bk.Put(o.key, v)
	}
	return 0, errors.New("storage: unknown write")
}

// putOwner records who set topic's retained message, or that nobody did
// (owner nil). An unchanged owner is not written again: a device that
// republishes its retained state dirties no page of the owner bucket.
func putOwner(tx *bolt.Tx, topic, owner []byte) error {
	ob := tx.Bucket(bucketRetainedBy)
	if ob == nil {
		return fmt.Errorf("storage: bucket %q missing", bucketRetainedBy)
	}
	if owner == nil {
		return ob.Delete(topic)
	}
	if bytes.Equal(ob.Get(topic), owner) {
		return nil
	}
	return ob.Put(topic, owner)
}

// earlyWrite is a write that reached the file before the queue or outbox
// record it is for. A subscriber can acknowledge a message, and a bridge
// can drop an entry to make room, before the batch that stores the record
// has been handed to the committer: its publisher is still routing it.
// Queue keys are sequences a session never reuses until its queue is
// deleted, outbox keys sequences a bridge never reuses until its outbox
// is opened again, so a delete that finds no record means the record,
// when it comes, is already gone; a packet identifier patch is applied to
// it instead. Only the queue and outbox buckets have early writes; the
// bridges' flight records do not.
type earlyWrite struct {
	deleted bool
	patch   []byte // the queue record's packet identifier and flags
	at      time.Time
}

// undo is how to take back one change to the early writes, or to a
// write guard, when the transaction that made it fails.
type undo struct {
	key   string
	prev  *earlyWrite // nil: key had none
	guard *atomic.Uint64
	was   uint64
}

// Bounds of the early writes: the record they wait for is at most one
// publish's routing behind, so a minute is ample; the count bounds the
// memory a stream of deletes of records that never come can take.
const (
	earlyKeep = time.Minute
	maxEarly  = 16384
)

// earlyKeyOf returns the early map's key of o's record, in scratch, or
// nil when o's bucket has no early writes.
func (db *DB) earlyKeyOf(o *op) []byte {
	db.earlyKey = db.earlyKey[:0]
	switch {
	case bytes.Equal(o.bucket, bucketOutbox):
		// The bridge's name, then the entry's 8-byte sequence (which
		// forgetEarly's prefix leaves off).
		db.earlyKey = append(append(append(db.earlyKey, 'o'), o.sub...), o.key...)
	case bytes.Equal(o.bucket, bucketQueue):
		db.earlyKey = append(append(db.earlyKey, 'q'), o.key...)
	default:
		return nil
	}
	return db.earlyKey
}

// setEarly replaces the early write of key, noting how to undo it.
func (db *DB) setEarly(key string, e *earlyWrite) {
	prev := db.early[key]
	db.undo = append(db.undo, undo{key: key, prev: prev})
	if e == nil {
		delete(db.early, key)
		return
	}
	if db.early == nil {
		db.early = make(map[string]*earlyWrite)
	}
	db.early[key] = e
}

// noteEarly records that o, a delete (patch nil) or a packet identifier
// patch, found no record.
func (db *DB) noteEarly(o *op, patch []byte) {
	k := db.earlyKeyOf(o)
	if k == nil {
		return
	}
	e := &earlyWrite{at: time.Now()}
	if prev := db.early[string(k)]; prev != nil {
		e.deleted, e.patch = prev.deleted, prev.patch
	} else if len(db.early) >= maxEarly {
		return
	}
	if patch == nil {
		e.deleted, e.patch = true, nil
	} else if !e.deleted {
		e.patch = bytes.Clone(patch)
	}
	db.setEarly(string(k), e)
}

// tookEarly returns and forgets the early write for o's record, if any.
func (db *DB) tookEarly(o *op) *earlyWrite {
	if len(db.early) == 0 {
		return nil
	}
	k := db.earlyKeyOf(o)
	if k == nil {
		return nil
	}
	e := db.early[string(k)]
	if e != nil {
		db.setEarly(string(k), nil)
	}
	return e
}

// forgetEarly forgets the early writes of the records o's queue prefix,
// or o's outbox, holds: they start numbering again.
func (db *DB) forgetEarly(o *op) {
	if len(db.early) == 0 {
		return
	}
	var prefix string
	switch {
	case bytes.Equal(o.bucket, bucketOutbox):
		prefix = "o" + string(o.sub)
	case bytes.Equal(o.bucket, bucketQueue):
		prefix = "q" + string(o.key)
	default:
		return
	}
	for k := range db.early {
		// An outbox's keys are its prefix and 8 bytes: another bridge
		// whose name starts with this one's has longer keys.
		if strings.HasPrefix(k, prefix) && (prefix[0] == 'q' || len(k) == len(prefix)+8) {
			db.setEarly(k, nil)
		}
	}
}

// rollbackEarly takes back what a failed transaction changed in the
// early writes and the write guards.
func (db *DB) rollbackEarly() {
	for i := len(db.undo) - 1; i >= 0; i-- {
		u := db.undo[i]
		switch {
		case u.guard != nil:
			u.guard.Store(u.was)
		case u.prev == nil:
			delete(db.early, u.key)
		default:
			db.early[u.key] = u.prev
		}
	}
	clear(db.undo)
	db.undo = db.undo[:0]
}

// sweepEarly forgets early writes whose record has not come within
// earlyKeep, checking at most every few seconds.
func (db *DB) sweepEarly(now time.Time) {
	if len(db.early) == 0 || now.Sub(db.earlySwept) < 5*time.Second {
		return
	}
	db.earlySwept = now
	for k, e := range db.early {
		if now.Sub(e.at) > earlyKeep {
			delete(db.early, k)
		}
	}
}
