package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// A QoS 2 message a bridge publishes upstream is delivered exactly once
// only if, after a restart, the bridge resumes its upstream session with
// the same packet identifier in the same stage: PUBLISH again (with DUP)
// while the server may not have it, PUBREL once the server said PUBREC.
// Those identifiers live in the upflight bucket, one bucket per bridge
// beside its outbox, keyed by the outbox entry's sequence. The bridge
// writes a record, durably, before the packet it describes goes out, and
// a delete of the outbox entry deletes its record in the same write.
//
// Records: the packet identifier (2 bytes), flags (bit 0: released), and
// a stamp (8 bytes) that orders the records of a bridge: when two hold
// one identifier, the older one's message completed before the identifier
// was taken again, and only its delete had not reached the disk.

// OutboxFlight is the upstream state of one QoS 2 outbox entry.
type OutboxFlight struct {
	Seq      uint64 // the outbox entry's sequence
	PID      uint16 // the packet identifier it was published under, from 1
	Released bool   // the server sent PUBREC: PUBREL is what is due, not the message
	Stamp    uint64 // when the record was written, in the bridge's own order
}

const upflightRecordSize = 11

// OutboxFlightPut records f for bridge, replacing any record of f.Seq.
func (b *Batch) OutboxFlightPut(bridge string, f *OutboxFlight) {
	name, key, v := b.reserveSeq(bridge, f.Seq, upflightRecordSize)
	v = binary.BigEndian.AppendUint16(v, f.PID)
	var flags byte
	if f.Released {
		flags = 1
	}
	v = append(v, flags)
	v = binary.BigEndian.AppendUint64(v, f.Stamp)
	b.ops = append(b.ops, op{kind: opOutboxPut, bucket: bucketUpflight, sub: name, key: key, val: v})
	b.bytes += 8 + len(v)
}

// OutboxFlightDelete removes the record of entry seq of bridge, if any.
// OutboxDelete and OutboxDrop remove the records of what they delete.
func (b *Batch) OutboxFlightDelete(bridge string, seq uint64) {
	name, key, _ := b.reserveSeq(bridge, seq, 0)
	b.ops = append(b.ops, op{kind: opOutboxDelete, bucket: bucketUpflight, sub: name, key: key})
}

// decodeUpflight decodes one record; ok is false for damage.
func decodeUpflight(k, v []byte) (f OutboxFlight, ok bool) {
	if len(k) != 8 || len(v) != upflightRecordSize {
		return f, false
	}
	f = OutboxFlight{
		Seq:      binary.BigEndian.Uint64(k),
		PID:      binary.BigEndian.Uint16(v),
		Released: v[2]&1 != 0,
		Stamp:    binary.BigEndian.Uint64(v[3:]),
	}
	return f, f.Seq != 0 && f.PID != 0 && v[2]&^1 == 0
}

// OutboxFlightSet is what OutboxFlights reads of a bridge.
type OutboxFlightSet struct {
	// Flights are the records, in sequence order.
	Flights []OutboxFlight
	// Bad counts the records that do not decode, which are left out: the
	// entries they describe go out again as new messages.
	Bad int
	// Tracked says that the bridge records its QoS 2 flights: the file
	// holds every identifier the upstream session can still hold for it
	// (see OutboxFlightsOpen).
	Tracked bool
}

// OutboxFlights reads bridge's QoS 2 flight records.
func (db *DB) OutboxFlights(bridge string) (OutboxFlightSet, error) {
	var set OutboxFlightSet
	err := guard("outbox flights", func() error {
		return db.bolt.View(func(tx *bolt.Tx) error {
			ub := tx.Bucket(bucketUpflight)
			if ub == nil || bridge == "" {
				return nil
			}
			bb := ub.Bucket([]byte(bridge))
			if bb == nil {
				return nil
			}
			set.Tracked = true
			return bb.ForEach(func(k, v []byte) error {
				if f, ok := decodeUpflight(k, v); ok {
					set.Flights = append(set.Flights, f)
				} else {
					set.Bad++
				}
				return nil
			})
		})
	})
	if err != nil {
		return OutboxFlightSet{}, fmt.Errorf("storage: QoS 2 flights of bridge %q: %w", bridge, err)
	}
	return set, nil
}

// OutboxFlightsOpen marks bridge as recording its QoS 2 flights from now
// on, so that OutboxFlights reports it Tracked even while it has none;
// OutboxDrop ends it. A bridge that is not tracked starts its upstream
// session afresh, since the server may hold identifiers nobody recorded.
func (b *Batch) OutboxFlightsOpen(bridge string) {
	name, _ := b.reserveOutbox(bridge, 0)
	b.ops = append(b.ops, op{kind: opOutboxOpen, bucket: bucketUpflight, sub: name})
}

// deleteUpflight removes the flight record under key k of bridge, after
// its outbox entry was deleted.
func deleteUpflight(tx *bolt.Tx, bridge, k []byte) error {
	ub := tx.Bucket(bucketUpflight)
	if ub == nil {
		return nil // a file opened before its migration: none recorded
	}
	bb := ub.Bucket(bridge)
	if bb == nil {
		return nil
	}
	err := bb.Delete(k)
	if errors.Is(err, berrors.ErrIncompatibleValue) {
		err = bb.DeleteBucket(k) // damage: a bucket under a record's key
	}
	return err
}

// dropUpflight removes bridge's flight records with its outbox.
func dropUpflight(tx *bolt.Tx, bridge []byte) error {
	ub := tx.Bucket(bucketUpflight)
	if ub == nil {
		return nil
	}
	if ub.Bucket(bridge) != nil {
		return ub.DeleteBucket(bridge)
	}
	return ub.Delete(bridge)
}
