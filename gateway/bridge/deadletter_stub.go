package bridge

// This file stands in for the dead-letter bucket (deadletter.go) until it
// lands: it takes the entry out of the outbox, whole, and counts it.

import (
	"errors"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

func (b *Bridge) deadLetter(e storage.OutboxEntry, reason string) error {
	db := b.opts.Store
	if db == nil {
		return errors.New("no state file")
	}
	var batch storage.Batch
	batch.OutboxDelete(b.name, e.Seq) // its flight record with it
	if err := db.CommitWait(&batch); err != nil {
		return err
	}
	ob := b.ob
	ob.mu.Lock()
	if _, ok := ob.inflight[e.Seq]; ok {
		delete(ob.inflight, e.Seq)
		ob.markGone(e.Seq, time.Now().UnixNano())
		ob.count--
		ob.bytes -= int64(e.Size())
		ob.forgetState(e.Msg.Topic, e.Seq)
		ob.dropped["dead_letter"]++
	}
	ob.mu.Unlock()
	b.flights.untrack(e.Seq)
	ob.signal()
	b.log.Warn("upstream keeps refusing a message; it is moved to the dead letters and the uplink goes on", "topic", e.Msg.Topic, "reason", reason)
	return nil
}
