package storage

import (
	"encoding/binary"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"
)

// A bridge's dead letters are the outbox entries it stopped trying to
// send: the upstream refused each so many times in a row that sending it
// again would only block the entries behind it. Each bridge has a bucket
// of them nested in the deadletter bucket, as it has one in the outbox
// bucket; they are keyed by a sequence of their own, 8 bytes big-endian,
// which the bridge assigns and never reuses while it holds any (the
// outbox's sequences start again when it is empty at a start, so they
// cannot serve). The bridge moves an entry here in one batch with its
// outbox delete (which deletes its QoS 2 flight record too), so that a
// power cut leaves it in one place or the other, never both, never none.
//
// Records: a format byte (1), the entry's outbox sequence (8 bytes), when
// it was moved in unix nanoseconds (8 bytes), the failures that moved it
// (uvarint), the reason (uvarint length and text), then the outbox record
// as the outbox keeps it (route, time queued, message).

// DeadLetter is an outbox entry its bridge stopped trying to send.
type DeadLetter struct {
	Seq      uint64      // position among the bridge's dead letters, ascending from 1; assigned by the bridge
	Entry    OutboxEntry // the outbox entry as it was; Entry.Seq is its outbox sequence
	Reason   string      // why: the upstream's reason, as the bridge logged it
	At       int64       // unix nanoseconds when it was moved
	Failures int         // the link's failures on it in a row that moved it; 0 when not counted
}

// deadLetterRecordV1 is the format byte of the records this build writes.
const deadLetterRecordV1 = 1

// deadLetterOverhead is what a dead letter counts against its bridge's
// bound on top of its entry's Size and its reason: the 17 bytes of its
// own header and the failures and reason lengths, rounded up to 32.
const deadLetterOverhead = 32

// Size returns the bytes d counts against its bridge's bound on dead
// letters: its entry's Size, its reason, and 32 bytes for its header.
func (d *DeadLetter) Size() int {
	return d.Entry.Size() + len(d.Reason) + deadLetterOverhead
}

func appendDeadLetter(dst []byte, d *DeadLetter) []byte {
	dst = append(dst, deadLetterRecordV1)
	dst = binary.BigEndian.AppendUint64(dst, d.Entry.Seq)
	dst = binary.BigEndian.AppendUint64(dst, uint64(d.At))
	dst = binary.AppendUvarint(dst, uint64(max(d.Failures, 0)))
	dst = binary.AppendUvarint(dst, uint64(len(d.Reason)))
	dst = append(dst, d.Reason...)
	return appendOutbox(dst, &d.Entry)
}

// deadLetterRecordSize is the length of d's record, as appendDeadLetter
// writes it.
func deadLetterRecordSize(d *DeadLetter) int {
	return 17 + uvarintLen(max(d.Failures, 0)) + uvarintLen(len(d.Reason)) + len(d.Reason) + outboxRecordSize(&d.Entry)
}

// splitDeadLetter reads a record's header and returns the outbox record
// after it, without copying.
func splitDeadLetter(b []byte) (d DeadLetter, outbox []byte, reason []byte, ok bool) {
	if len(b) < 17 || b[0] != deadLetterRecordV1 {
		return d, nil, nil, false
	}
	d.Entry.Seq = binary.BigEndian.Uint64(b[1:])
	d.At = int64(binary.BigEndian.Uint64(b[9:]))
	b = b[17:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > math.MaxInt32 { // an int on every platform
		return d, nil, nil, false
	}
	d.Failures = int(n)
	if reason, b, ok = lenPrefixed(b[k:]); !ok {
		return d, nil, nil, false
	}
	return d, b, reason, true
}

func decodeDeadLetter(seq uint64, b []byte) (DeadLetter, bool) {
	d, rec, reason, ok := splitDeadLetter(b)
	if !ok {
		return d, false
	}
	e, ok := decodeOutbox(d.Entry.Seq, rec)
	d.Seq, d.Entry, d.Reason = seq, e, string(reason)
	return d, ok
}

// deadLetterPartsSize is Size for a record split by splitDeadLetter, or
// false when its outbox record does not split.
func deadLetterPartsSize(rec, reason []byte) (int, bool) {
	_, _, p, ok := splitOutbox(rec)
	if !ok {
		return 0, false
	}
	return outboxPartsSize(&p) + len(reason) + deadLetterOverhead, true
}

// DeadLetterPut stores d among bridge's dead letters under d.Seq, or
// replaces the one there. Seq 0 is refused at commit.
func (b *Batch) DeadLetterPut(bridge string, d *DeadLetter) {
	name, key, rec := b.reserveSeq(bridge, d.Seq, deadLetterRecordSize(d))
	val := appendDeadLetter(rec, d)
	b.ops = append(b.ops, op{kind: opOutboxPut, bucket: bucketDeadLetter, sub: name, key: key, val: val})
	b.bytes += 8 + len(val)
}

// DeadLetterDelete removes dead letter seq of bridge; it is no error if
// there is none.
func (b *Batch) DeadLetterDelete(bridge string, seq uint64) {
	name, key, _ := b.reserveSeq(bridge, seq, 0)
	b.ops = append(b.ops, op{kind: opOutboxDelete, bucket: bucketDeadLetter, sub: name, key: key})
}

// DeadLetterScan calls fn for bridge's dead letters with Seq > after, in
// Seq order, until fn returns false or max were passed to it (max <= 0:
// no limit). Like OutboxScan it reads in short transactions and calls fn
// outside them, and fn owns what it gets; dead letters that do not decode
// are skipped and named after the scan in an *OutboxDecodeError.
func (db *DB) DeadLetterScan(bridge string, after uint64, max int, fn func(*DeadLetter) bool) error {
	bad := &OutboxDecodeError{Bridge: bridge, dead: true}
	err := scanSequenced(db, "dead letter scan", bucketDeadLetter, bridge, after, max, bad, decodeDeadLetter, fn)
	if err != nil {
		return fmt.Errorf("storage: dead letters of bridge %q: %w", bridge, err)
	}
	return bad.orNil()
}

// DeadLetterNewest returns up to n of bridge's newest dead letters, in
// Seq order (the newest last), read in one short transaction. Those that
// do not decode are left out.
func (db *DB) DeadLetterNewest(bridge string, n int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := guard("dead letters", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			bb := nestedBucket(tx, bucketDeadLetter, bridge)
			if bb == nil {
				return nil
			}
			c := bb.Cursor()
			for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
				if len(k) != 8 || v == nil {
					continue
				}
				if d, ok := decodeDeadLetter(binary.BigEndian.Uint64(k), v); ok {
					out = append(out, d)
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: dead letters of bridge %q: %w", bridge, err)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// DeadLetterInfo summarises a bridge's dead letters.
type DeadLetterInfo struct {
	Count    int    // dead letters
	Bytes    int64  // their Size, summed
	FirstSeq uint64 // the lowest Seq, 0 when none
	LastSeq  uint64 // the highest Seq, 0 when none
}

// DeadLetterInfo summarises bridge's dead letters, reading every record's
// header. With records that do not decode it returns the summary of the
// others and an *OutboxDecodeError naming them; LastSeq counts them too,
// so that a new dead letter never takes the key of a damaged one.
func (db *DB) DeadLetterInfo(bridge string) (DeadLetterInfo, error) {
	var info DeadLetterInfo
	bad := &OutboxDecodeError{Bridge: bridge, dead: true}
	err := guard("dead letter info", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			if bb := nestedBucket(tx, bucketDeadLetter, bridge); bb != nil {
				info = summariseDead(bb, bad)
			}
			return nil
		})
	})
	if err != nil {
		return info, fmt.Errorf("storage: dead letters of bridge %q: %w", bridge, err)
	}
	return info, bad.orNil()
}

// summariseDead reads one bridge's dead-letter bucket, noting what does
// not decode in bad.
func summariseDead(bb *bolt.Bucket, bad *OutboxDecodeError) DeadLetterInfo {
	var info DeadLetterInfo
	c := bb.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 || v == nil {
			bad.note(k)
			continue
		}
		seq := binary.BigEndian.Uint64(k)
		info.LastSeq = seq
		_, rec, reason, ok := splitDeadLetter(v)
		size := 0
		if ok {
			size, ok = deadLetterPartsSize(rec, reason)
		}
		if !ok {
			bad.note(k)
			continue
		}
		if info.Count == 0 {
			info.FirstSeq = seq
		}
		info.Count++
		info.Bytes += int64(size)
	}
	return info
}
