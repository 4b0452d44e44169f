package bridge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// A message the upstream keeps refusing (a topic it does not accept, a
// QoS it will not take, a link it closes on that message) would block
// every message behind it for as long as it is queued. The run goroutine
// moves such an entry out of the outbox into the bridge's dead letters in
// the state file, in one committed batch, and the uplink goes on behind
// it. Dead letters are counted, logged with their topic and the server's
// reason, bounded in bytes (max_dead_letter_bytes: the oldest go first,
// counted and logged), kept across restarts, and retried (moved back to
// the end of the outbox) or dropped by a person, through the ops endpoint
// or fieldgate db deadletters. None is ever dropped silently.

// Drop reasons of dead letters, as counted in Stats.Dropped.
const (
	DropDeadLetterFull = "dead_letter_full"    // the oldest dead letter, dropped to keep max_dead_letter_bytes
	DropDeadLetter     = "dead_letter_dropped" // dropped by a command
)

// Errors of the dead-letter operations.
var (
	// ErrNoDeadLetter wraps the error for a sequence the bridge holds
	// no dead letter under.
	ErrNoDeadLetter = errors.New("no such dead letter")
	// ErrNoStateFile is what a bridge without a state file (a test's)
	// says: it has no dead letters.
	ErrNoStateFile = errors.New("no state file to keep dead letters in")
)

// MaxDeadLetterList bounds what one DeadLetters call returns: a page a
// person reads on the status page or in a terminal, with every payload in
// memory at once. fieldgate db deadletters reads a stopped gateway's file
// for all of them.
const MaxDeadLetterList = 1000

// deadLetterChunk is how many dead letters a retry or drop moves in one
// committed batch: one fsync for many, and a bounded batch however many
// the bridge holds.
const deadLetterChunk = 256

// deadLetters serialises the moves into and out of the bucket. Its
// counters live in the outbox (ob.dead), under ob.mu, which Stats takes;
// they change only with mu held as well.
type deadLetters struct {
	mu sync.Mutex
}

// loadDeadLetters reads the dead letters' counters from storage at New.
func (b *Bridge) loadDeadLetters(max int64) error {
	b.ob.dead.max = max
	db := b.opts.Store
	if db == nil {
		b.ob.dead.next = 1
		return nil
	}
	info, err := db.DeadLetterInfo(b.name)
	var bad *storage.OutboxDecodeError
	if errors.As(err, &bad) {
		// Kept, and named, for someone to drop: they are no one's to
		// drop silently, and they block nothing.
		b.log.Warn("dead letters do not decode; drop them with fieldgate db deadletters drop", "err", err)
	} else if err != nil {
		return err
	}
	b.ob.dead.count, b.ob.dead.bytes, b.ob.dead.next = info.Count, info.Bytes, info.LastSeq+1
	if info.Count > 0 {
		b.log.Warn("dead letters from before are kept; retry or drop them with fieldgate db deadletters", "messages", info.Count, "bytes", info.Bytes)
	}
	return nil
}

// deadLetter moves outbox entry e into the dead letters because the
// upstream refused it, reason being what the server said. The run
// goroutine calls it while the link is down, for an entry not in flight.
func (b *Bridge) deadLetter(e storage.OutboxEntry, reason string) error {
	return b.deadLetterAfter(e, reason, 0)
}

// deadLetterAfter is deadLetter recording the failures, in a row, that
// moved the entry. The outbox delete, the dead letter, the delete of the
// entry's QoS 2 flight record (which the outbox delete carries) and of
// the oldest dead letters that make room for it are one committed batch:
// a crash leaves the entry in one place, whole. An entry whose PUBREC
// came is refused: the server has it, and its release is what is due.
func (b *Bridge) deadLetterAfter(e storage.OutboxEntry, reason string, failures int) error {
	db := b.opts.Store
	if db == nil {
		return fmt.Errorf("bridge %s: %w", b.name, ErrNoStateFile)
	}
	if b.flights.received(e.Seq) {
		return fmt.Errorf("bridge %s: outbox entry %d (topic %q) was received upstream (PUBREC); its release is due, not a dead letter", b.name, e.Seq, e.Msg.Topic)
	}
	b.dead.mu.Lock()
	defer b.dead.mu.Unlock()
	ob := b.ob
	now := time.Now()
	ob.mu.Lock()
	var stored *storage.OutboxEntry
	if _, gone := ob.gone[e.Seq]; !gone {
		stored = ob.entry(e.Seq)
	}
	if stored == nil {
		ob.mu.Unlock()
		return fmt.Errorf("bridge %s: outbox entry %d (topic %q) is no longer queued", b.name, e.Seq, e.Msg.Topic)
	}
	// Gone from now on for the scans that drop for room or age, and for
	// the sender; taken back if the batch fails.
	ob.markGone(e.Seq, now.UnixNano())
	d := storage.DeadLetter{Seq: ob.dead.next, Entry: *stored, Reason: reason, At: now.UnixNano(), Failures: failures}
	limit, held := ob.dead.max, ob.dead.bytes
	ob.mu.Unlock()

	var batch storage.Batch
	batch.OutboxDelete(b.name, e.Seq)
	size := int64(d.Size())
	keep := size <= limit
	var evicted []storage.DeadLetter
	var freed int64
	if keep {
		batch.DeadLetterPut(b.name, &d)
		if over := held + size - limit; over > 0 {
			evicted, freed = b.oldestDeadLetters(over)
			for _, old := range evicted {
				batch.DeadLetterDelete(b.name, old.Seq)
			}
		}
	}
	if err := db.CommitWait(&batch); err != nil {
		ob.mu.Lock()
		delete(ob.gone, e.Seq)
		ob.mu.Unlock()
		return fmt.Errorf("bridge %s: moving outbox entry %d (topic %q) to the dead letters: %w", b.name, e.Seq, e.Msg.Topic, err)
	}
	ob.mu.Lock()
	ob.count--
	ob.bytes -= int64(stored.Size())
	ob.forgetState(stored.Msg.Topic, e.Seq)
	delete(ob.inflight, e.Seq)
	ob.dead.moved++
	ob.dead.count -= len(evicted)
	ob.dead.bytes -= freed
	ob.dropped[DropDeadLetterFull] += uint64(len(evicted))
	if keep {
		ob.dead.next++
		ob.dead.count++
		ob.dead.bytes += size
	} else {
		ob.dropped[DropDeadLetterFull]++
	}
	ob.mu.Unlock()
	b.flights.untrack(e.Seq)
	ob.signal()
	if keep {
		b.log.Warn("upstream keeps refusing a message; it is moved to the dead letters and the uplink goes on",
			"topic", stored.Msg.Topic, "reason", reason, "dead_letter", d.Seq, "failures", failures)
	} else {
		b.log.Error("upstream keeps refusing a message larger than max_dead_letter_bytes; it is dropped",
			"topic", stored.Msg.Topic, "reason", reason, "bytes", size, "max_dead_letter_bytes", limit)
	}
	for _, old := range evicted {
		b.log.Warn("oldest dead letter dropped to keep max_dead_letter_bytes",
			"topic", old.Entry.Msg.Topic, "reason", old.Reason, "dead_letter", old.Seq, "max_dead_letter_bytes", limit)
	}
	return nil
}

// oldestDeadLetters returns the oldest dead letters that add up to need
// bytes or more, and their bytes. Called with dead.mu held.
func (b *Bridge) oldestDeadLetters(need int64) (out []storage.DeadLetter, freed int64) {
	// Those that do not decode are skipped: they stay, named by Check,
	// for a person to drop.
	_ = b.opts.Store.DeadLetterScan(b.name, 0, 0, func(d *storage.DeadLetter) bool {
		out = append(out, *d)
		freed += int64(d.Size())
		return freed < need
	})
	return out, freed
}

// DeadLetters returns up to limit of the bridge's newest dead letters
// (at most MaxDeadLetterList; limit <= 0 asks for that many), oldest
// first.
func (b *Bridge) DeadLetters(limit int) ([]storage.DeadLetter, error) {
	if b.opts.Store == nil {
		return nil, nil
	}
	if limit <= 0 || limit > MaxDeadLetterList {
		limit = MaxDeadLetterList
	}
	return b.opts.Store.DeadLetterNewest(b.name, limit)
}

// RetryDeadLetters moves the dead letters seqs (nil or empty: all of
// them) back to the end of the outbox as new entries, in the order they
// were moved (their sequence's),
// under their route's current QoS, class and budget, and returns how many
// it moved. An unknown sequence, or one whose out-route is no longer
// configured, is an error naming it, and nothing is moved. A state
// route's dead letter whose topic has a newer message queued is dropped
// as superseded. When the outbox has no room (an alarm route's messages
// are never dropped for room) the retry stops there with an error; what
// it moved stays moved.
func (b *Bridge) RetryDeadLetters(seqs []uint64) (int, error) {
	db := b.opts.Store
	if db == nil {
		return 0, fmt.Errorf("bridge %s: %w", b.name, ErrNoStateFile)
	}
	b.dead.mu.Lock()
	defer b.dead.mu.Unlock()
	rt := b.rt.Load()
	moved := 0
	routed := func(d *storage.DeadLetter) error {
		if int(d.Entry.Route) >= len(rt.outs) {
			return fmt.Errorf("bridge %s: dead letter %d (topic %q) came from out[%d], which is no longer configured; drop it, or configure the route again", b.name, d.Seq, d.Entry.Msg.Topic, d.Entry.Route)
		}
		return nil
	}
	err := b.eachDeadLetterChunk(seqs, routed, func(chunk []storage.DeadLetter, _ []uint64) (bool, error) {
		var batch storage.Batch
		var superseded []storage.DeadLetter
		var freed int64
		done, full := 0, false
		now := time.Now()
		b.ob.mu.Lock()
		for i := range chunk {
			d := &chunk[i]
			r := &rt.outs[d.Entry.Route]
			if _, newer := b.ob.state[d.Entry.Msg.Topic]; r.Class == ClassState && newer {
				superseded = append(superseded, *d)
			} else {
				e := storage.OutboxEntry{Route: d.Entry.Route, Added: now.UnixNano(), Msg: d.Entry.Msg}
				e.Msg.QoS = byte(r.QoS)
				if !b.ob.admit(r, &e, &batch) {
					full = true
					break
				}
			}
			batch.DeadLetterDelete(b.name, d.Seq)
			freed += int64(d.Size())
			done++
		}
		b.ob.mu.Unlock()
		if err := db.CommitWait(&batch); err != nil {
			return false, fmt.Errorf("bridge %s: retrying dead letters: %w", b.name, err)
		}
		b.ob.mu.Lock()
		b.ob.dead.count -= done
		b.ob.dead.bytes -= freed
		b.ob.dropped[DropSuperseded] += uint64(len(superseded))
		b.ob.mu.Unlock()
		moved += done - len(superseded)
		for _, d := range superseded {
			b.log.Warn("dead letter of a state route dropped on retry: a newer message of its topic is queued", "topic", d.Entry.Msg.Topic, "dead_letter", d.Seq)
		}
		if full {
			return false, fmt.Errorf("bridge %s: the outbox is full (max_outbox_bytes %d); dead letter %d (topic %q) and those after it stay", b.name, b.ob.max, chunk[done].Seq, chunk[done].Entry.Msg.Topic)
		}
		return true, nil
	})
	if moved > 0 {
		b.log.Info("dead letters moved back to the outbox", "messages", moved)
		b.ob.signal()
	}
	return moved, err
}

// DropDeadLetters deletes the dead letters seqs (nil or empty: all of
// them), those that do not decode included, counting each under
// DropDeadLetter, and returns how many it deleted. An unknown sequence is
// an error naming it, and nothing is deleted.
func (b *Bridge) DropDeadLetters(seqs []uint64) (int, error) {
	db := b.opts.Store
	if db == nil {
		return 0, fmt.Errorf("bridge %s: %w", b.name, ErrNoStateFile)
	}
	b.dead.mu.Lock()
	defer b.dead.mu.Unlock()
	dropped := 0
	var first []uint64
	err := b.eachDeadLetterChunk(seqs, nil, func(chunk []storage.DeadLetter, damaged []uint64) (bool, error) {
		var batch storage.Batch
		var freed int64
		for _, d := range chunk {
			batch.DeadLetterDelete(b.name, d.Seq)
			freed += int64(d.Size())
		}
		for _, seq := range damaged {
			batch.DeadLetterDelete(b.name, seq)
		}
		if err := db.CommitWait(&batch); err != nil {
			return false, fmt.Errorf("bridge %s: dropping dead letters: %w", b.name, err)
		}
		b.ob.mu.Lock()
		b.ob.dead.count -= len(chunk)
		b.ob.dead.bytes -= freed
		b.ob.dropped[DropDeadLetter] += uint64(len(chunk) + len(damaged))
		b.ob.mu.Unlock()
		dropped += len(chunk) + len(damaged)
		for _, d := range chunk {
			if len(first) < 8 {
				first = append(first, d.Seq)
			}
		}
		return true, nil
	})
	if dropped > 0 {
		b.log.Warn("dead letters dropped by a command", "messages", dropped, "first", seqList(first, dropped))
	}
	return dropped, err
}

// seqList writes sequences for a log line, with an ellipsis when they
// are the first few of n.
func seqList(seqs []uint64, n int) string {
	var s strings.Builder
	for i, seq := range seqs {
		if i > 0 {
			s.WriteByte(',')
		}
		fmt.Fprint(&s, seq)
	}
	if n > len(seqs) {
		s.WriteString(",…")
	}
	return s.String()
}

// eachDeadLetterChunk calls fn with the dead letters seqs names (nil or
// empty: all of them) in sequence order, up to deadLetterChunk at a time,
// until fn returns false or an error. Without check, those that do not
// decode are passed in damaged; with it, naming one is an error, and
// check must pass every dead letter before fn sees any. The sequences
// named are all looked up first: an unknown one is an error naming it,
// before fn is called at all. Called with dead.mu held.
func (b *Bridge) eachDeadLetterChunk(seqs []uint64, check func(*storage.DeadLetter) error, fn func(chunk []storage.DeadLetter, damaged []uint64) (bool, error)) error {
	db := b.opts.Store
	if len(seqs) == 0 {
		if check != nil {
			var failed error
			err := db.DeadLetterScan(b.name, 0, 0, func(d *storage.DeadLetter) bool {
				failed = check(d)
				return failed == nil
			})
			if failed != nil {
				return failed
			}
			var bad *storage.OutboxDecodeError
			if err != nil && !errors.As(err, &bad) {
				return err
			}
		}
		after := uint64(0)
		for {
			var chunk []storage.DeadLetter
			err := db.DeadLetterScan(b.name, after, deadLetterChunk, func(d *storage.DeadLetter) bool {
				chunk = append(chunk, *d)
				return true
			})
			var damaged []uint64
			var bad *storage.OutboxDecodeError
			if errors.As(err, &bad) {
				for _, seq := range bad.Seqs {
					after = max(after, seq)
				}
				if check == nil {
					damaged = bad.Seqs
				}
			} else if err != nil {
				return err
			}
			if n := len(chunk); n > 0 {
				after = max(after, chunk[n-1].Seq)
			}
			if len(chunk) == 0 && len(damaged) == 0 {
				if bad != nil && len(bad.Seqs) > 0 {
					continue // only damaged ones in this read, skipped
				}
				return nil
			}
			if more, err := fn(chunk, damaged); err != nil || !more {
				return err
			}
		}
	}
	want := slices.Clone(seqs)
	slices.Sort(want)
	want = slices.Compact(want)
	var found []storage.DeadLetter
	var damaged, unknown []uint64
	for _, seq := range want {
		var got *storage.DeadLetter
		err := db.DeadLetterScan(b.name, seq-1, 1, func(d *storage.DeadLetter) bool {
			got = d
			return false
		})
		var bad *storage.OutboxDecodeError
		switch {
		case seq != 0 && got != nil && got.Seq == seq:
			if check != nil {
				if err := check(got); err != nil {
					return err
				}
			}
			found = append(found, *got)
		case errors.As(err, &bad) && slices.Contains(bad.Seqs, seq):
			if check != nil {
				return fmt.Errorf("bridge %s: dead letter %d does not decode; it cannot be retried, only dropped", b.name, seq)
			}
			damaged = append(damaged, seq)
		case err != nil && !errors.As(err, &bad):
			return err
		default:
			unknown = append(unknown, seq)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("bridge %s: %w: %s", b.name, ErrNoDeadLetter, seqList(unknown, len(unknown)))
	}
	for len(found) > 0 || len(damaged) > 0 {
		n := min(len(found), deadLetterChunk)
		more, err := fn(found[:n], damaged)
		if err != nil || !more {
			return err
		}
		found, damaged = found[n:], nil
	}
	return nil
}
