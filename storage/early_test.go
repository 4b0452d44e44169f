package storage

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestEarlyQueueWrites: a subscriber's acknowledgement (Dequeue) or a
// packet identifier (SetInflight) can reach the committer before the
// publisher's batch that stores the message. The dequeued record must not
// appear afterwards, nor count in QueuedBytes; the patched one must carry
// its identifier; and a session started again after DeleteSession must
// store its queue from seq 1 as usual.
func TestEarlyQueueWrites(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) { b.PutSession(&Session{ClientID: "sub", Expiry: time.Hour}) })

	commit(t, db, func(b *Batch) { b.Dequeue("sub", 1) })
	commit(t, db, func(b *Batch) { b.SetInflight("sub", 2, 41, false) })
	commit(t, db, func(b *Batch) {
		b.Enqueue("sub", queued(1, "acked-early"))
		b.Enqueue("sub", queued(2, "patched-early"))
		b.Enqueue("sub", queued(3, "plain"))
	})
	st := loadAll(t, db)["sub"]
	if st == nil {
		t.Fatal("session sub not loaded")
	}
	if got := seqs(st.Queue); len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("queue %v, want [2 3]: the record dequeued before it arrived must stay gone", got)
	}
	if st.Queue[0].PID != 41 || st.Queue[1].PID != 0 {
		t.Errorf("packet identifiers %d and %d, want 41 (patched before the record arrived) and 0", st.Queue[0].PID, st.Queue[1].PID)
	}
	want := int64(0)
	for _, q := range st.Queue {
		want += int64(len(appendQueued(nil, &q)))
	}
	if got := db.QueuedBytes(); got != want {
		t.Errorf("QueuedBytes %d, want %d: the skipped record must not count", got, want)
	}

	// The session ends and starts again, numbering from 1: an early
	// delete of its old incarnation must not swallow the new record.
	commit(t, db, func(b *Batch) { b.Dequeue("sub", 9) })
	commit(t, db, func(b *Batch) {
		b.DeleteSession("sub")
		b.PutSession(&Session{ClientID: "sub", Expiry: time.Hour})
	})
	commit(t, db, func(b *Batch) { b.Enqueue("sub", queued(9, "new incarnation")) })
	if got := seqs(loadAll(t, db)["sub"].Queue); len(got) != 1 || got[0] != 9 {
		t.Errorf("after DeleteSession: queue %v, want [9]", got)
	}

	// Early writes whose record never comes are forgotten.
	commit(t, db, func(b *Batch) { b.Dequeue("sub", 100) })
	if len(db.early) != 1 {
		t.Fatalf("%d early writes, want 1", len(db.early))
	}
	db.sweepEarly(time.Now().Add(2 * earlyKeep))
	if len(db.early) != 0 {
		t.Errorf("%d early writes after the sweep, want 0", len(db.early))
	}
}

// TestEarlyOutboxDelete: a bridge can drop an outbox entry (superseded, or
// for room) while the batch that stores it is still with its publisher;
// the entry must not appear when that batch arrives.
func TestEarlyOutboxDelete(t *testing.T) {
	db := openTemp(t, Options{})
	entry := func(seq uint64) *OutboxEntry {
		return &OutboxEntry{Seq: seq, Route: 0, Added: 1, Msg: Message{Topic: "state/x", Payload: []byte("v"), QoS: 1}}
	}
	commit(t, db, func(b *Batch) { b.OutboxPut("cloud", entry(1)) })
	commit(t, db, func(b *Batch) { b.OutboxDelete("cloud", 2) })
	commit(t, db, func(b *Batch) {
		b.OutboxPut("cloud", entry(2))
		b.OutboxPut("cloud", entry(3))
	})
	var got []uint64
	if err := db.OutboxScan("cloud", 0, 10, func(e *OutboxEntry) bool { got = append(got, e.Seq); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("outbox %v, want [1 3]: the entry deleted before it arrived must stay gone", got)
	}
	// A delete of another bridge's entry with the same sequence is not
	// this one's.
	commit(t, db, func(b *Batch) { b.OutboxDelete("other", 4) })
	commit(t, db, func(b *Batch) { b.OutboxPut("cloud", entry(4)) })
	info, err := db.OutboxInfo("cloud")
	if err != nil {
		t.Fatal(err)
	}
	if info.Count != 3 {
		t.Errorf("%d entries, want 3", info.Count)
	}
}

// TestGuardedRetained: two changes of one retained topic whose batches
// reach the committer in the opposite order of their numbers leave the
// later change in the file; a change whose batch comes first is written
// even when a later one has been made but not yet written.
func TestGuardedRetained(t *testing.T) {
	db := openTemp(t, Options{})
	var filed atomic.Uint64
	set := func(payload string, change uint64) *Batch {
		b := &Batch{}
		b.SetRetained(&Message{Topic: "site/mode", Payload: []byte(payload), QoS: 1, Retain: true})
		b.GuardLast(&filed, change)
		return b
	}
	retained := func() string {
		t.Helper()
		m, err := db.Retained("site/mode")
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			return "none"
		}
		return string(m.Payload)
	}
	first, second, third := set("first", 1), set("second", 2), set("third", 3)
	// The first change's batch comes first, with the later ones made
	// but not handed over yet: it is written.
	if err := db.CommitWait(first); err != nil {
		t.Fatal(err)
	}
	if got := retained(); got != "first" {
		t.Fatalf("retained %s after the first change's commit, want first", got)
	}
	// The second change rides after another write, appended: its guard
	// must follow it, and skip it, not the write before it.
	carrier := &Batch{}
	carrier.PutSession(&Session{ClientID: "carrier", Expiry: time.Hour})
	carrier.Append(second)
	for _, b := range []*Batch{third, carrier} {
		if err := db.CommitWait(b); err != nil {
			t.Fatal(err)
		}
	}
	if got := retained(); got != "third" {
		t.Fatalf("retained %s, want third, the later of the two that came out of order", got)
	}
	if filed.Load() != 3 {
		t.Errorf("guard %d, want 3", filed.Load())
	}
	if _, ok := loadAll(t, db)["carrier"]; !ok {
		t.Error("the write before the skipped one was not applied")
	}
	del := &Batch{}
	del.DeleteRetained("site/mode")
	del.GuardLast(&filed, 4)
	if err := db.CommitWait(del); err != nil {
		t.Fatal(err)
	}
	if got := retained(); got != "none" {
		t.Errorf("retained %s after the guarded delete, want none", got)
	}
}

// TestEarlyWritesRollBack: a transaction that fails takes back what it
// did to the early writes and to the write guards, so that a record or a
// retained change it skipped is written when it comes again.
func TestEarlyWritesRollBack(t *testing.T) {
	db := openTemp(t, Options{})
	var filed atomic.Uint64
	fail := &Batch{}
	fail.Dequeue("sub", 1)
	fail.SetRetained(&Message{Topic: "site/mode", Payload: []byte("lost"), QoS: 1, Retain: true})
	fail.GuardLast(&filed, 2)
	// A write to a bucket the file does not have, which no Batch method
	// builds, passes validation and fails the transaction after the others.
	fail.put([]byte("no such bucket"), []byte("k"), []byte("v"))
	if err := db.CommitWait(fail); err == nil {
		t.Fatal("the transaction with a bad write committed")
	}
	if filed.Load() != 0 || len(db.early) != 0 {
		t.Fatalf("after the failed commit: guard %d, %d early writes; want 0 and 0", filed.Load(), len(db.early))
	}
	ok := &Batch{}
	ok.Enqueue("sub", queued(1, "kept"))
	ok.SetRetained(&Message{Topic: "site/mode", Payload: []byte("kept"), QoS: 1, Retain: true})
	ok.GuardLast(&filed, 1)
	if err := db.CommitWait(ok); err != nil {
		t.Fatal(err)
	}
	if keys := rawKeys(t, db, bucketQueue); len(keys) != 1 {
		t.Errorf("queue keys %q, want the one record: the failed delete must not skip it", keys)
	}
	if m, _ := db.Retained("site/mode"); m == nil || string(m.Payload) != "kept" {
		t.Errorf("retained %v, want kept: the failed change must not outrank it", m)
	}
}

// TestEarlyWritesScope: the bridges' flight records have no early writes,
// and opening an outbox again forgets those of its earlier entries.
func TestEarlyWritesScope(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		b.OutboxFlightsOpen("cloud")
		b.OutboxFlightDelete("cloud", 7)
		b.OutboxDelete("cloud", 8)
	})
	if len(db.early) != 1 {
		t.Fatalf("%d early writes, want 1: the outbox entry's, not the flight record's", len(db.early))
	}
	commit(t, db, func(b *Batch) {
		b.OutboxPut("cloud", &OutboxEntry{Seq: 7, Msg: Message{Topic: "t", QoS: 2}})
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 7, PID: 3, Stamp: 1})
		b.OutboxDelete("cloudy", 8) // another bridge: not forgotten below
		b.OutboxOpen("cloud")
		b.OutboxPut("cloud", &OutboxEntry{Seq: 8, Msg: Message{Topic: "t", QoS: 1}})
	})
	set, err := db.OutboxFlights("cloud")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Flights) != 1 || set.Flights[0].PID != 3 {
		t.Errorf("flight records %+v, want the one of entry 7", set.Flights)
	}
	info, err := db.OutboxInfo("cloud")
	if err != nil {
		t.Fatal(err)
	}
	if info.Count != 2 {
		t.Errorf("%d entries, want 2: entry 8 came after the outbox was opened again", info.Count)
	}
	if len(db.early) != 1 {
		t.Errorf("%d early writes, want 1, the other bridge's", len(db.early))
	}
}
