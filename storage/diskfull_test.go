package storage

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// TestDiskFull fills the file system under the state file. A commit that
// does not fit fails through its callback, the file stays sound, and
// commits work again as soon as there is room, without reopening.
func TestDiskFull(t *testing.T) {
	dir := testkit.SmallTmpfs(t, "1m")
	// Room to free later, in case bbolt cannot commit even a delete while
	// the disk is full: it writes new pages before it frees old ones.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			db.Close()
		}
	})

	// commitSafely commits b and returns its error, failing the test if
	// anything panics on the way.
	commitSafely := func(b *Batch) (err error) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("commit on a full disk panicked: %v", r)
			}
		}()
		errc := make(chan error, 1)
		db.Commit(b, func(err error) { errc <- err })
		return <-errc
	}
	payload := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 16<<10) }

	stored := map[string][]byte{} // what committed, so what must be there
	var fullErr error
	for i := range 200 {
		topic := fmt.Sprintf("fill/%03d", i)
		var b Batch
		b.SetRetained(&Message{Topic: topic, Payload: payload(i)})
		if fullErr = commitSafely(&b); fullErr != nil {
			break
		}
		stored[topic] = payload(i)
	}
	if fullErr == nil {
		t.Fatal("a 1 MiB file system never filled")
	}
	t.Logf("full after %d messages of 16 KiB: %v", len(stored), fullErr)
	if !errors.Is(fullErr, syscall.ENOSPC) {
		t.Errorf("error %v does not wrap ENOSPC", fullErr)
	}
	if st := db.CommitStats(); st.Failures == 0 {
		t.Errorf("failure not counted: %+v", st)
	}

	// More large commits fail the same way, or squeeze into space a
	// failed one left free; a failure must not leave anything behind.
	failures := 1
	for i := 200; i < 210; i++ {
		topic := fmt.Sprintf("fill/%03d", i)
		var b Batch
		b.SetRetained(&Message{Topic: topic, Payload: payload(i)})
		if err := commitSafely(&b); err != nil {
			failures++
			continue
		}
		stored[topic] = payload(i)
	}
	t.Logf("%d of 11 large commits failed while full", failures)

	// A small commit may squeeze in or fail; either is fine.
	var small Batch
	small.SetRetained(&Message{Topic: "small", Payload: []byte("s")})
	if err := commitSafely(&small); err == nil {
		stored["small"] = []byte("s")
	} else {
		t.Logf("small commit while full: %v", err)
	}

	// Delete all but a few, and make room if even that does not fit.
	topics := slices.Sorted(maps.Keys(stored))
	var del Batch
	for _, topic := range topics[3:] {
		del.DeleteRetained(topic)
	}
	if err := commitSafely(&del); err != nil {
		t.Logf("delete while full: %v; removing the filler", err)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if err := commitSafely(&del); err != nil {
			t.Fatalf("delete with room again: %v", err)
		}
	}
	for _, topic := range topics[3:] {
		delete(stored, topic)
	}

	// Commits work again, without reopening.
	for i := range 5 {
		topic := fmt.Sprintf("after/%d", i)
		var b Batch
		b.SetRetained(&Message{Topic: topic, Payload: payload(100 + i)})
		if err := commitSafely(&b); err != nil {
			t.Fatalf("commit %d after making room: %v", i, err)
		}
		stored[topic] = payload(100 + i)
	}
	if problems := db.Check(); len(problems) > 0 {
		t.Errorf("check before reopening: %q", problems)
	}

	closed = true
	if err := db.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	db, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	closed = false
	if problems := db.Check(); len(problems) > 0 {
		t.Errorf("check after reopening: %q", problems)
	}
	for topic, want := range stored {
		m, err := db.Retained(topic)
		if err != nil || m == nil || !bytes.Equal(m.Payload, want) {
			t.Errorf("%s: committed, then %+v, %v after reopening", topic, m, err)
		}
	}
	if n := db.RetainedCount(); n != len(stored) {
		t.Errorf("%d retained after reopening, want %d", n, len(stored))
	}
}
