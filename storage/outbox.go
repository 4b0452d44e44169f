package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// A bridge's outbox holds the messages waiting to be sent to its cloud
// broker. The broker puts an entry in the same batch as a publish's other
// effects, so it is stored before the local publisher hears that its
// message was; the bridge deletes it once the upstream acknowledged it.
// Each bridge has a bucket of its own, nested in the outbox bucket and
// named after it; entries are keyed by their sequence, 8 bytes big-endian,
// so that a cursor reads them in order.

// OutboxEntry is one message waiting in a bridge's outbox.
type OutboxEntry struct {
	Seq   uint64  // position in the bridge's outbox, ascending from 1; assigned by the bridge, never reused
	Route uint16  // index of the out-route it matched
	Added int64   // unix nanoseconds when it was queued (for TTL and the oldest age)
	Msg   Message // Topic is the remote topic; the rest as sent upstream
}

// outboxEntryOverhead is what an entry counts against a byte budget on top
// of its topic, payload and properties. On disk an empty message takes
// about 45 bytes: its 8-byte key, bbolt's 16-byte leaf element, the
// 10-byte outbox header, the message's 9-byte header and its two length
// prefixes. 64 rounds that up for the slack of half-filled pages, so that
// a flood of empty messages fills a budget about as fast as it fills the
// SD card.
const outboxEntryOverhead = 64

// Size returns the bytes e counts against a byte budget: its topic,
// payload and properties, and 64 bytes for the record and bbolt's keeping.
func (e *OutboxEntry) Size() int {
	return len(e.Msg.Topic) + len(e.Msg.Payload) + len(e.Msg.Props) + outboxEntryOverhead
}

// outboxPartsSize is Size for a record split by splitOutbox.
func outboxPartsSize(p *messageParts) int {
	return len(p.topic) + len(p.payload) + len(p.props) + outboxEntryOverhead
}

// OutboxPut adds entry e.Seq to bridge's outbox, or replaces it. Seq 0 is
// refused at commit: a scan from the start would pass it by.
func (b *Batch) OutboxPut(bridge string, e *OutboxEntry) {
	name, key, rec := b.reserveSeq(bridge, e.Seq, outboxRecordSize(e))
	val := appendOutbox(rec, e)
	b.ops = append(b.ops, op{kind: opOutboxPut, bucket: bucketOutbox, sub: name, key: key, val: val})
	b.bytes += 8 + len(val)
}

// OutboxDelete removes entry seq from bridge's outbox; it is no error if
// there is none.
func (b *Batch) OutboxDelete(bridge string, seq uint64) {
	name, key, _ := b.reserveSeq(bridge, seq, 0)
	b.ops = append(b.ops, op{kind: opOutboxDelete, bucket: bucketOutbox, sub: name, key: key})
}

// reserveSeq reserves a key for entry seq of bridge, written, and n bytes
// after it for a record, returned empty with room for n.
func (b *Batch) reserveSeq(bridge string, seq uint64, n int) (name, key, rec []byte) {
	name, buf := b.reserveOutbox(bridge, 8+n)
	binary.BigEndian.PutUint64(buf, seq)
	return name, buf[:8:8], buf[8:8]
}

// OutboxOpen creates bridge's outbox if it has none. A bridge opening its
// outbox commits it before its first entry: its sequences may start again
// from what the file holds, and deletes of entries the file never had are
// forgotten (see the early writes in commit.go).
func (b *Batch) OutboxOpen(bridge string) {
	name, _ := b.reserveOutbox(bridge, 0)
	b.ops = append(b.ops, op{kind: opOutboxOpen, bucket: bucketOutbox, sub: name})
}

// OutboxDrop deletes bridge's whole outbox, for a bridge removed from the
// configuration.
func (b *Batch) OutboxDrop(bridge string) {
	name, _ := b.reserveOutbox(bridge, 0)
	b.ops = append(b.ops, op{kind: opOutboxDrop, bucket: bucketOutbox, sub: name})
}

// OutboxDecodeError reports outbox entries, or dead letters, that do not
// decode; it wraps ErrCorrupt.
type OutboxDecodeError struct {
	Bridge  string
	Seqs    []uint64 // the entries that do not decode, which OutboxDelete (DeadLetterDelete) removes
	BadKeys int      // keys that are no 8-byte sequence, which only OutboxDrop removes
	dead    bool     // of the dead letters, not the outbox
}

// Error names the bridge and the entries, the first few by sequence.
func (e *OutboxDecodeError) Error() string {
	var b strings.Builder
	what := "outbox"
	if e.dead {
		what = "dead letters"
	}
	fmt.Fprintf(&b, "%v: %s of bridge %q:", ErrCorrupt, what, e.Bridge)
	if n := len(e.Seqs); n > 0 {
		const show = 8
		fmt.Fprintf(&b, " %d entries do not decode (sequence", n)
		for i, s := range e.Seqs[:min(n, show)] {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, " %d", s)
		}
		if n > show {
			b.WriteString(", …")
		}
		b.WriteByte(')')
	}
	if e.BadKeys > 0 {
		if len(e.Seqs) > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %d keys are no 8-byte sequence", e.BadKeys)
	}
	return b.String()
}

// Unwrap returns ErrCorrupt.
func (e *OutboxDecodeError) Unwrap() error { return ErrCorrupt }

// orNil returns e as an error, nil when it names nothing.
func (e *OutboxDecodeError) orNil() error {
	if len(e.Seqs) == 0 && e.BadKeys == 0 {
		return nil
	}
	return e
}

// note records an entry that cannot be returned: its key is not a
// sequence, or its value not an entry (a nested bucket has none).
func (e *OutboxDecodeError) note(k []byte) {
	if len(k) != 8 {
		e.BadKeys++
		return
	}
	e.Seqs = append(e.Seqs, binary.BigEndian.Uint64(k))
}

// nestedBucket returns bridge's bucket nested in bucket (its outbox, its
// dead letters), or nil when it has none. A file of an older schema
// opened read only may lack bucket itself.
func nestedBucket(tx *bolt.Tx, bucket []byte, bridge string) *bolt.Bucket {
	ob := tx.Bucket(bucket)
	if ob == nil || bridge == "" {
		return nil
	}
	return ob.Bucket([]byte(bridge))
}

// Scans read this many entries, or this many record bytes, in one read
// transaction, then hand them to the callback outside it. A transaction
// held for the length of a slow callback would keep bbolt from reusing
// the pages freed meanwhile and from growing its memory map, and a
// callback that waits for a commit would then wait forever.
const (
	outboxScanEntries = 256
	outboxScanBytes   = 1 << 20
)

// OutboxScan calls fn for the entries of bridge's outbox with Seq > after,
// in Seq order, until fn returns false or max entries were passed to it
// (max <= 0: no limit). fn owns each entry it gets, byte slices included,
// and runs outside any transaction: it may commit, and wait for it.
// Entries written during a scan may or may not be seen; none is seen
// twice. Expired entries are returned too: dropping them is the bridge's.
//
// Entries that do not decode are skipped, so that a damaged one cannot
// stop a bridge for good, and reported after the scan in an
// *OutboxDecodeError, which names them for OutboxDelete.
func (db *DB) OutboxScan(bridge string, after uint64, max int, fn func(*OutboxEntry) bool) error {
	bad := &OutboxDecodeError{Bridge: bridge}
	err := scanSequenced(db, "outbox scan", bucketOutbox, bridge, after, max, bad, decodeOutbox, fn)
	if err != nil {
		return fmt.Errorf("storage: outbox of bridge %q: %w", bridge, err)
	}
	return bad.orNil()
}

// scanSequenced is the scan of a bucket of bridge's records keyed by an 8-byte
// sequence, nested in bucket: OutboxScan's, and the dead letters'. It
// reads at most outboxScanEntries records, or outboxScanBytes, in one
// read transaction, and calls fn outside it; records that do not decode
// are noted in bad and skipped. It returns only a read's error.
func scanSequenced[T any](db *DB, what string, bucket []byte, bridge string, after uint64, max int, bad *OutboxDecodeError,
	decode func(seq uint64, v []byte) (T, bool), fn func(*T) bool) error {
	if after == ^uint64(0) {
		return nil
	}
	seek := binary.BigEndian.AppendUint64(make([]byte, 0, 8), after+1) // where the next read starts
	skipFirst := false                                                 // whether the key at seek was read already
	passed := 0
	var chunk []*T
	for {
		limit := outboxScanEntries
		if max > 0 {
			limit = min(limit, max-passed)
		}
		chunk = chunk[:0]
		more := false
		err := guard(what, func() error {
			return db.bolt.View(func(tx *bolt.Tx) error {
				bb := nestedBucket(tx, bucket, bridge)
				if bb == nil {
					return nil
				}
				c := bb.Cursor()
				k, v := c.Seek(seek)
				if skipFirst && bytes.Equal(k, seek) {
					k, v = c.Next()
				}
				var last []byte
				read := 0
				for ; k != nil; k, v = c.Next() {
					if len(chunk) == limit || read >= outboxScanBytes {
						more = true
						break
					}
					last = k
					read += len(v)
					if len(k) != 8 || v == nil {
						bad.note(k)
						continue
					}
					e, ok := decode(binary.BigEndian.Uint64(k), v)
					if !ok {
						bad.note(k)
						continue
					}
					chunk = append(chunk, &e)
				}
				if last != nil {
					// Keys are 8 bytes but for damage: this copy stays
					// in seek's array.
					seek, skipFirst = append(seek[:0], last...), true
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
		for _, e := range chunk {
			passed++
			if !fn(e) || (max > 0 && passed >= max) {
				return nil
			}
		}
		if !more {
			return nil
		}
	}
}

// OutboxInfo summarises a bridge's outbox; the entries that do not decode
// are left out of it.
type OutboxInfo struct {
	Count    int    // entries
	Bytes    int64  // their Size, summed
	FirstSeq uint64 // the lowest Seq, 0 when empty
	LastSeq  uint64 // the highest Seq, 0 when empty
	Oldest   int64  // the lowest Added (the first entry's, unless the clock went back), 0 when empty
}

// OutboxInfo summarises bridge's outbox, reading every entry's header.
// With entries that do not decode it returns the summary of the others
// and an *OutboxDecodeError naming them.
func (db *DB) OutboxInfo(bridge string) (OutboxInfo, error) {
	var info OutboxInfo
	bad := &OutboxDecodeError{Bridge: bridge}
	err := guard("outbox info", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			if bb := nestedBucket(tx, bucketOutbox, bridge); bb != nil {
				info = summarise(bb, bad)
			}
			return nil
		})
	})
	if err != nil {
		return info, fmt.Errorf("storage: outbox of bridge %q: %w", bridge, err)
	}
	return info, bad.orNil()
}

// summarise reads one bridge's outbox bucket, noting what does not decode
// in bad.
func summarise(bb *bolt.Bucket, bad *OutboxDecodeError) OutboxInfo {
	var info OutboxInfo
	c := bb.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 || v == nil {
			bad.note(k)
			continue
		}
		_, added, p, ok := splitOutbox(v)
		if !ok {
			bad.note(k)
			continue
		}
		seq := binary.BigEndian.Uint64(k)
		if info.Count == 0 {
			info.FirstSeq, info.Oldest = seq, added
		}
		info.Count++
		info.LastSeq = seq
		info.Bytes += int64(outboxPartsSize(&p))
		info.Oldest = min(info.Oldest, added)
	}
	return info
}

// OutboxBridges returns the names of the bridges that have an outbox,
// sorted: those that stored an entry since their outbox was last
// dropped, even if it is empty now.
func (db *DB) OutboxBridges() ([]string, error) {
	var names []string
	err := guard("outbox bridges", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			ob := tx.Bucket(bucketOutbox)
			if ob == nil {
				return nil
			}
			// bbolt keeps keys in byte order, which is Go's string order.
			return ob.ForEach(func(k, v []byte) error {
				if v == nil { // a record here is no bridge's; Check reports it
					names = append(names, string(k))
				}
				return nil
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: outbox bridges: %w", err)
	}
	return names, nil
}
