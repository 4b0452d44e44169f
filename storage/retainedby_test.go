package storage

import (
	"path/filepath"
	"sync/atomic"
	"testing"
)

// retainedEntries returns RetainedEntries' report by topic.
func retainedEntries(t testing.TB, db *DB) map[string]RetainedEntry {
	t.Helper()
	got := map[string]RetainedEntry{}
	if err := db.RetainedEntries(func(e RetainedEntry) { got[e.Topic] = e }); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestRetainedOwners: who set a retained message is kept with it, follows
// its replacement, goes with its delete, and a batch can take its last
// write back.
func TestRetainedOwners(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		b.SetRetainedBy(&Message{Topic: "a/1", Payload: []byte("12345")}, "alice")
		b.SetRetainedBy(&Message{Topic: "a/2", Payload: []byte("x"), Props: []byte{1, 1}}, "")
		b.SetRetained(&Message{Topic: "a/3", Payload: []byte("xy")})
	})
	got := retainedEntries(t, db)
	want := map[string]RetainedEntry{
		"a/1": {Topic: "a/1", User: "alice", Owned: true, Bytes: 3 + 5},
		"a/2": {Topic: "a/2", User: "", Owned: true, Bytes: 3 + 2 + 1},
		"a/3": {Topic: "a/3", Bytes: 3 + 2},
	}
	for topic, w := range want {
		if got[topic] != w {
			t.Errorf("%s: %+v, want %+v", topic, got[topic], w)
		}
	}

	// Replaced by another user, by the gateway, deleted; a write taken
	// back leaves nothing.
	commit(t, db, func(b *Batch) {
		b.SetRetainedBy(&Message{Topic: "a/3", Payload: []byte("z")}, "bob")
		b.SetRetained(&Message{Topic: "a/1", Payload: []byte("z")})
		b.DeleteRetained("a/2")
		b.SetRetainedBy(&Message{Topic: "a/4", Payload: []byte("never")}, "mallory")
		b.DropLast()
	})
	got = retainedEntries(t, db)
	if len(got) != 2 || got["a/3"].User != "bob" || !got["a/3"].Owned || got["a/1"].Owned {
		t.Errorf("after changes: %+v", got)
	}
	if problems := db.Check(); len(problems) > 0 {
		t.Errorf("check: %q", problems)
	}
}

// TestRetainedOwnerGuarded: the owner is part of the guarded write, so
// two changes applied in the other order keep the later change's owner.
func TestRetainedOwnerGuarded(t *testing.T) {
	db := openTemp(t, Options{})
	var filed atomic.Uint64
	var early, late Batch
	early.SetRetainedBy(&Message{Topic: "t", Payload: []byte("1")}, "alice")
	early.GuardLast(&filed, 1)
	late.SetRetainedBy(&Message{Topic: "t", Payload: []byte("2")}, "bob")
	late.GuardLast(&filed, 2)
	for _, b := range []*Batch{&late, &early} {
		if err := db.CommitWait(b); err != nil {
			t.Fatal(err)
		}
	}
	if e := retainedEntries(t, db)["t"]; e.User != "bob" {
		t.Errorf("owner %+v, want bob's", e)
	}
}

// TestRetainedOwnersMigrated: the retained messages of a file written
// before owners were kept have none.
func TestRetainedOwnersMigrated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema2Fixture, path)
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got := retainedEntries(t, db)
	if len(got) != len(schema2Retained) {
		t.Errorf("%d entries, want %d", len(got), len(schema2Retained))
	}
	for _, m := range schema2Retained {
		e := got[m.Topic]
		if e.Owned || e.Bytes != len(m.Topic)+len(m.Props)+len(m.Payload) {
			t.Errorf("%s: %+v", m.Topic, e)
		}
	}
}
