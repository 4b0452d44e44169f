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
// later change in the file.
func TestGuardedRetained(t *testing.T) {
	db := openTemp(t, Options{})
	var ver atomic.Uint64
	set := func(payload string, seq uint64) *Batch {
		b := &Batch{}
		b.SetRetained(&Message{Topic: "site/mode", Payload: []byte(payload), QoS: 1, Retain: true})
		b.GuardLast(&ver, seq)
		return b
	}
	older := set("old", 1)
	ver.Store(1)
	newer := set("new", 2)
	ver.Store(2)
	for _, b := range []*Batch{newer, older} {
		if err := db.CommitWait(b); err != nil {
			t.Fatal(err)
		}
	}
	m, err := db.Retained("site/mode")
	if err != nil {
		t.Fatal(err)
	}
	if m == nil || string(m.Payload) != "new" {
		t.Fatalf("retained %v, want the later change, new", m)
	}
	del := &Batch{}
	del.DeleteRetained("site/mode")
	del.GuardLast(&ver, 3)
	ver.Store(3)
	if err := db.CommitWait(del); err != nil {
		t.Fatal(err)
	}
	if m, _ := db.Retained("site/mode"); m != nil {
		t.Errorf("retained %q after the guarded delete, want none", m.Payload)
	}
}
