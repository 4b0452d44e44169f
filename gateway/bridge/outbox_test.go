package bridge

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// newTestOutbox opens a state file and an outbox in it, with one
// telemetry route at QoS 1.
func newTestOutbox(t *testing.T) (*outbox, *outRoute, *storage.DB) {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "state.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	r := &outRoute{OutRoute: OutRoute{QoS: 1, Class: ClassTelemetry}}
	ob, err := newOutbox(db, "cloud", 1<<20, time.Hour, []outRoute{*r})
	if err != nil {
		t.Fatal(err)
	}
	return ob, r, db
}

// TestOldestSkipsWhatIsGone: the age of the outbox is that of its oldest
// queued entry, not of an acknowledged one whose lazy delete has not
// landed yet, and zero once nothing is queued.
func TestOldestSkipsWhatIsGone(t *testing.T) {
	ob, r, db := newTestOutbox(t)
	first, second := time.Now().Add(-time.Hour), time.Now().Add(-time.Minute)
	var b storage.Batch
	ob.put(r, "up/1", []byte("1"), false, &b, first)
	ob.put(r, "up/2", []byte("2"), false, &b, second)
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	if got := ob.oldest(); !got.Equal(time.Unix(0, first.UnixNano())) {
		t.Fatalf("oldest %v with both queued, want the first's %v", got, first)
	}
	sent := ob.next(2)
	if len(sent) != 2 {
		t.Fatalf("next handed %d entries, want 2", len(sent))
	}
	ob.acked(sent[0].Seq, sent[0].Msg.Topic, "")
	if got := ob.oldest(); !got.Equal(time.Unix(0, second.UnixNano())) {
		t.Errorf("oldest %v after the first was acknowledged, want the second's %v", got, second)
	}
	ob.acked(sent[1].Seq, sent[1].Msg.Topic, "")
	if got := ob.oldest(); !got.IsZero() {
		t.Errorf("oldest %v with nothing queued, want zero (the deletes are still pending)", got)
	}
}

// settle waits until every batch submitted to db, lazy ones included, is
// applied.
func settle(t *testing.T, db *storage.DB) {
	t.Helper()
	done := make(chan error, 1)
	db.After(func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestNextPassesDroppedTail: entries dropped before they were sent, at the
// end of the outbox, leave nothing pending once their deletes landed, so
// that the sender does not look for them at every turn.
func TestNextPassesDroppedTail(t *testing.T) {
	ob, r, db := newTestOutbox(t)
	old := time.Now().Add(-2 * time.Hour)
	var b storage.Batch
	ob.put(r, "up/1", []byte("1"), false, &b, old)
	ob.put(r, "up/2", []byte("2"), false, &b, old)
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	ob.expire(time.Now()) // older than the hour's TTL: both dropped
	settle(t, db)
	if !ob.pending() {
		t.Fatal("nothing pending before next looked; the test sets up nothing")
	}
	if got := ob.next(8); len(got) != 0 {
		t.Fatalf("next handed %d dropped entries", len(got))
	}
	if ob.pending() {
		t.Error("the dropped entries are still pending after next read past them")
	}
}
