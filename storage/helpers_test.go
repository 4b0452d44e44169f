package storage

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openTemp opens a new state file in a temporary directory and closes it
// when the test ends.
func openTemp(t testing.TB, opts Options) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "state.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// reopen closes db and opens its file again.
func reopen(t testing.TB, db *DB, opts Options) *DB {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	db2, err := Open(db.Path(), opts)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(func() { db2.Close() })
	return db2
}

// commit applies the batch that build fills and fails the test if the
// commit does.
func commit(t testing.TB, db *DB, build func(b *Batch)) {
	t.Helper()
	var b Batch
	build(&b)
	if err := db.CommitWait(&b); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// loadAll returns every stored session by client id.
func loadAll(t testing.TB, db *DB) map[string]*SessionState {
	t.Helper()
	all := map[string]*SessionState{}
	var order []string
	err := db.Load(func(st *SessionState) error {
		all[st.ClientID] = st
		order = append(order, st.ClientID)
		return nil
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	for i := 1; i < len(order); i++ {
		if order[i-1] >= order[i] {
			t.Fatalf("load: sessions out of client id order: %q", order)
		}
	}
	return all
}

// rawKeys lists the keys of one bucket, read past the package's API.
func rawKeys(t testing.TB, db *DB, bucket []byte) []string {
	t.Helper()
	var keys []string
	err := db.bolt.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, _ []byte) error {
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// rawUpdate changes a closed state file with bbolt directly, the way a
// bug, an older build or another program would.
func rawUpdate(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	if err := bdb.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// sameMessage reports how two messages differ, or "" when they do not;
// an empty payload and a nil one are the same.
func sameMessage(got, want *Message) string {
	switch {
	case got == nil || want == nil:
		if got != want {
			return fmt.Sprintf("got %v, want %v", got, want)
		}
	case got.Topic != want.Topic:
		return fmt.Sprintf("topic %q, want %q", got.Topic, want.Topic)
	case !bytes.Equal(got.Payload, want.Payload):
		return fmt.Sprintf("payload %q, want %q", got.Payload, want.Payload)
	case !bytes.Equal(got.Props, want.Props):
		return fmt.Sprintf("props %x, want %x", got.Props, want.Props)
	case got.Expiry != want.Expiry || got.QoS != want.QoS || got.Retain != want.Retain:
		return fmt.Sprintf("expiry/qos/retain %d/%d/%t, want %d/%d/%t",
			got.Expiry, got.QoS, got.Retain, want.Expiry, want.QoS, want.Retain)
	}
	return ""
}

// copyFile copies src to dst.
func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// errIs fails the test unless err wraps target.
func errIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want one wrapping %v", err, target)
	}
}
