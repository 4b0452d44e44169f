package storage

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// deadLetter is the dead letter seq made of outbox entry from, its
// fields derived from both.
func deadLetter(seq, from uint64) *DeadLetter {
	return &DeadLetter{Seq: seq, Entry: *entry(from), Reason: fmt.Sprintf("refused %d", from),
		At: 1_760_000_000_000_000_000 + int64(seq), Failures: int(from % 5)}
}

// sameDeadLetter reports how two dead letters differ, or "".
func sameDeadLetter(got, want *DeadLetter) string {
	if got.Seq != want.Seq || got.Reason != want.Reason || got.At != want.At || got.Failures != want.Failures {
		return fmt.Sprintf("dead letter %+v, want seq %d reason %q at %d failures %d", got, want.Seq, want.Reason, want.At, want.Failures)
	}
	return sameEntry(&got.Entry, &want.Entry)
}

// deadSeqs returns the sequences DeadLetterScan passes, failing on an
// error.
func deadSeqs(t testing.TB, db *DB, bridge string, after uint64, max int) []uint64 {
	t.Helper()
	var seqs []uint64
	err := db.DeadLetterScan(bridge, after, max, func(d *DeadLetter) bool {
		seqs = append(seqs, d.Seq)
		return true
	})
	if err != nil {
		t.Fatalf("dead letter scan %s after %d max %d: %v", bridge, after, max, err)
	}
	return seqs
}

// TestDeadLetterMove moves outbox entries to the dead letters the way a
// bridge does, in one batch with the outbox delete, and reads them back
// whole, across a reopen; the QoS 2 flight record of a moved entry goes
// with it, and another bridge's are untouched.
func TestDeadLetterMove(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 5; seq++ {
			b.OutboxPut("cloud", entry(seq))
			b.OutboxPut("cloud-b", entry(seq))
		}
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 2, PID: 9, Stamp: 1})
		b.OutboxFlightPut("cloud", &OutboxFlight{Seq: 4, PID: 10, Stamp: 2})
	})
	move := func(seq, from uint64) {
		commit(t, db, func(b *Batch) {
			b.OutboxDelete("cloud", from)
			b.DeadLetterPut("cloud", deadLetter(seq, from))
		})
	}
	move(1, 2)
	move(2, 5)
	db = reopen(t, db, Options{})

	if got := scanSeqs(t, db, "cloud", 0, 0); !slices.Equal(got, []uint64{1, 3, 4}) {
		t.Errorf("outbox after the moves: %v", got)
	}
	if got, _ := flights(t, db, "cloud"); len(got) != 1 || got[0].Seq != 4 {
		t.Errorf("flight records after the moves: %+v, want only entry 4's", got)
	}
	var got []*DeadLetter
	if err := db.DeadLetterScan("cloud", 0, 0, func(d *DeadLetter) bool { got = append(got, d); return true }); err != nil {
		t.Fatal(err)
	}
	want := []*DeadLetter{deadLetter(1, 2), deadLetter(2, 5)}
	if len(got) != len(want) {
		t.Fatalf("%d dead letters, want %d", len(got), len(want))
	}
	var bytes int64
	for i := range want {
		if d := sameDeadLetter(got[i], want[i]); d != "" {
			t.Error(d)
		}
		bytes += int64(want[i].Size())
	}
	info, err := db.DeadLetterInfo("cloud")
	if wantInfo := (DeadLetterInfo{Count: 2, Bytes: bytes, FirstSeq: 1, LastSeq: 2}); err != nil || info != wantInfo {
		t.Errorf("info %+v, %v; want %+v", info, err, wantInfo)
	}
	if info, err := db.DeadLetterInfo("cloud-b"); err != nil || info != (DeadLetterInfo{}) {
		t.Errorf("a bridge without dead letters: %+v, %v", info, err)
	}
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.DeadLetters) != 1 || st.DeadLetters[0].Bridge != "cloud" || st.DeadLetters[0].DeadLetterInfo != info {
		t.Errorf("stats: %+v", st.DeadLetters)
	}
	if p := db.Check(); len(p) > 0 {
		t.Errorf("check: %q", p)
	}

	// Deleted (retried or dropped), they are gone; a delete of one that
	// is not there is no error.
	commit(t, db, func(b *Batch) {
		b.DeadLetterDelete("cloud", 1)
		b.DeadLetterDelete("cloud", 77)
		b.DeadLetterDelete("nowhere", 1)
	})
	if s := deadSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{2}) {
		t.Errorf("after the delete: %v", s)
	}
}

// TestDeadLetterScan: scans page through many dead letters, past the
// read's chunk, from any point and up to a limit; DeadLetterNewest reads
// from the end.
func TestDeadLetterScan(t *testing.T) {
	db := openTemp(t, Options{})
	const n = outboxScanEntries*2 + 10
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= n; seq++ {
			if seq%100 != 0 { // gaps: retried and dropped ones
				b.DeadLetterPut("cloud", deadLetter(seq, seq))
			}
		}
	})
	all := deadSeqs(t, db, "cloud", 0, 0)
	if len(all) != n-n/100 || all[0] != 1 || all[len(all)-1] != n {
		t.Fatalf("scan: %d dead letters from %d to %d", len(all), all[0], all[len(all)-1])
	}
	if s := deadSeqs(t, db, "cloud", 99, 3); !slices.Equal(s, []uint64{101, 102, 103}) {
		t.Errorf("after 99, 3 of them: %v", s)
	}
	if s := deadSeqs(t, db, "cloud", n, 0); s != nil {
		t.Errorf("after the last: %v", s)
	}
	newest, err := db.DeadLetterNewest("cloud", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(newest) != 3 || newest[0].Seq != n-2 || newest[2].Seq != n {
		t.Errorf("newest 3: %+v", newest)
	}
	if d := sameDeadLetter(&newest[2], deadLetter(n, n)); d != "" {
		t.Error(d)
	}
	if none, err := db.DeadLetterNewest("other", 3); err != nil || none != nil {
		t.Errorf("another bridge's newest: %v, %v", none, err)
	}
}

// TestDeadLetterDamaged: a dead letter that does not decode is skipped by
// scans and named after them, left out of the summary but not of LastSeq
// (a new one must not take its key), reported by Check, and deleted like
// any other.
func TestDeadLetterDamaged(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= 3; seq++ {
			b.DeadLetterPut("cloud", deadLetter(seq, seq))
		}
	})
	path := db.Path()
	db.Close()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		bb := tx.Bucket(bucketDeadLetter).Bucket([]byte("cloud"))
		if err := bb.Put(binary.BigEndian.AppendUint64(nil, 2), []byte{9, 9}); err != nil {
			return err
		}
		return bb.Put(binary.BigEndian.AppendUint64(nil, 4), []byte{deadLetterRecordV1})
	})
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var seqs []uint64
	err = db.DeadLetterScan("cloud", 0, 0, func(d *DeadLetter) bool { seqs = append(seqs, d.Seq); return true })
	var bad *OutboxDecodeError
	if !errors.As(err, &bad) || !slices.Equal(bad.Seqs, []uint64{2, 4}) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("scan error %v", err)
	}
	if !strings.Contains(err.Error(), `dead letters of bridge "cloud"`) {
		t.Errorf("error %q does not say whose dead letters", err)
	}
	if !slices.Equal(seqs, []uint64{1, 3}) {
		t.Errorf("scan passed %v", seqs)
	}
	info, err := db.DeadLetterInfo("cloud")
	if info.Count != 2 || info.LastSeq != 4 || !errors.As(err, &bad) {
		t.Errorf("info %+v, %v", info, err)
	}
	problems := strings.Join(db.Check(), "\n")
	for _, want := range []string{`deadletter "cloud": record of sequence 2 does not decode`, `deadletter "cloud": record of sequence 4 does not decode`} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
	commit(t, db, func(b *Batch) { b.DeadLetterDelete("cloud", 2); b.DeadLetterDelete("cloud", 4) })
	if p := db.Check(); len(p) > 0 {
		t.Errorf("check after deleting them: %q", p)
	}
}

// TestDeadLetterSeqZero: sequence 0 is refused at commit, as the outbox's.
func TestDeadLetterSeqZero(t *testing.T) {
	db := openTemp(t, Options{})
	var b Batch
	b.DeadLetterPut("cloud", deadLetter(0, 1))
	err := db.CommitWait(&b)
	errIs(t, err, ErrInvalidWrite)
	if !strings.Contains(err.Error(), "deadletter") {
		t.Errorf("error %q does not name the bucket", err)
	}
}

// schema5Fixture is a state file as schema 5 wrote it; regenerate with
//
//	FIELDGATE_WRITE_FIXTURE=1 go test -run TestWriteSchema5Fixture ./storage
const schema5Fixture = "testdata/schema5.db"

// TestWriteSchema5Fixture writes the fixture with bbolt alone, in the
// layout schema 5 had: schema 4's buckets and retainedby, an outbox with a
// QoS 2 flight record, no deadletter bucket.
func TestWriteSchema5Fixture(t *testing.T) {
	writeFixture(t, schema5Fixture, 5, []string{"meta", "retained", "sessions", "subs", "queue", "rel", "outbox", "upflight", "retainedby"}, func(tx *bolt.Tx) error {
		for _, m := range schema2Retained {
			if err := tx.Bucket(bucketRetained).Put([]byte(m.Topic), appendMessage(nil, &m)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketRetainedBy).Put([]byte(m.Topic), []byte("usensor")); err != nil {
				return err
			}
		}
		bb, err := tx.Bucket(bucketOutbox).CreateBucket([]byte("cloud"))
		if err != nil {
			return err
		}
		for seq := uint64(1); seq <= 5; seq++ {
			if err := bb.Put(binary.BigEndian.AppendUint64(nil, seq), appendOutbox(nil, entry(seq))); err != nil {
				return err
			}
		}
		ub, err := tx.Bucket(bucketUpflight).CreateBucket([]byte("cloud"))
		if err != nil {
			return err
		}
		return ub.Put(binary.BigEndian.AppendUint64(nil, 2), []byte{0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	})
}

// TestSchemaMigrate5: a schema 5 file read only is not migrated (Check
// says the deadletter bucket is missing, the reads find none); opened, it
// gains the bucket and keeps its outbox and flights, and dead letters
// work.
func TestSchemaMigrate5(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyFile(t, schema5Fixture, path)
	if v, buckets := fileSchema(t, path); v != 5 || slices.Contains(buckets, "deadletter") || !slices.Contains(buckets, "retainedby") {
		t.Fatalf("fixture has schema %d and buckets %q; want schema 5 with retainedby, without deadletter", v, buckets)
	}
	ro, err := OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := ro.DeadLetterInfo("cloud"); err != nil || info != (DeadLetterInfo{}) {
		t.Errorf("read-only schema 5 info: %+v, %v", info, err)
	}
	if s := deadSeqs(t, ro, "cloud", 0, 0); s != nil {
		t.Errorf("read-only schema 5 scan: %v", s)
	}
	if st, err := ro.Stats(); err != nil || st.DeadLetters != nil {
		t.Errorf("read-only schema 5 stats: %+v, %v", st.DeadLetters, err)
	}
	problems := strings.Join(ro.Check(), "\n")
	for _, want := range []string{fmt.Sprintf("schema version 00000005, want %d", SchemaVersion), "bucket deadletter is missing"} {
		if !strings.Contains(problems, want) {
			t.Errorf("check did not report %q:\n%s", want, problems)
		}
	}
	ro.Close()
	for round := range 2 { // the second open finds it migrated already
		db, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if s := scanSeqs(t, db, "cloud", 0, 0); len(s) != 5-round {
			t.Errorf("round %d: outbox %v", round, s)
		}
		if got, _ := flights(t, db, "cloud"); round == 0 && (len(got) != 1 || got[0].PID != 7) {
			t.Errorf("flights after migration: %+v", got)
		}
		if p := db.Check(); len(p) > 0 {
			t.Errorf("check after migration: %q", p)
		}
		if round == 0 {
			commit(t, db, func(b *Batch) {
				b.OutboxDelete("cloud", 2)
				b.DeadLetterPut("cloud", deadLetter(1, 2))
			})
		}
		if s := deadSeqs(t, db, "cloud", 0, 0); !slices.Equal(s, []uint64{1}) {
			t.Errorf("round %d: dead letters %v", round, s)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if v, buckets := fileSchema(t, path); v != SchemaVersion || !slices.Contains(buckets, "deadletter") {
			t.Fatalf("migrated file has schema %d and buckets %q", v, buckets)
		}
	}
}

// moveChildEnv names the state file the child of TestDeadLetterMoveCrash
// moves entries in.
const moveChildEnv = "FIELDGATE_DEADLETTER_CHILD"

// TestDeadLetterMoveCrash kills a process, with SIGKILL, while it moves
// outbox entries to the dead letters one committed batch at a time: after
// each kill every entry is in exactly one of the two, and every move the
// child saw committed is a dead letter.
func TestDeadLetterMoveCrash(t *testing.T) {
	if path := os.Getenv(moveChildEnv); path != "" {
		moveChild(path)
		return
	}
	const entries = 120
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, db, func(b *Batch) {
		for seq := uint64(1); seq <= entries; seq++ {
			b.OutboxPut("cloud", entry(seq))
		}
	})
	db.Close()
	committed := 0
	for kill := 0; committed < entries; kill++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDeadLetterMoveCrash$")
		cmd.Env = append(os.Environ(), moveChildEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Killed after a few moves each time, at a moment that falls
		// anywhere in the next commit.
		sc := bufio.NewScanner(out)
		wait := 5 + kill%7
		for sc.Scan() {
			n, _ := strconv.Atoi(sc.Text())
			committed = max(committed, n)
			if wait--; wait == 0 {
				break
			}
		}
		_ = cmd.Process.Kill()
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		ro, err := OpenReadOnly(path)
		if err != nil {
			t.Fatal(err)
		}
		inOutbox := scanSeqs(t, ro, "cloud", 0, 0)
		var dead []uint64
		err = ro.DeadLetterScan("cloud", 0, 0, func(d *DeadLetter) bool {
			if d.Seq != d.Entry.Seq {
				t.Errorf("dead letter %d holds entry %d", d.Seq, d.Entry.Seq)
			}
			if diff := sameEntry(&d.Entry, entry(d.Entry.Seq)); diff != "" {
				t.Error(diff)
			}
			dead = append(dead, d.Entry.Seq)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if p := ro.Check(); len(p) > 0 {
			t.Errorf("check after kill %d: %q", kill, p)
		}
		ro.Close()
		all := slices.Sorted(slices.Values(append(slices.Clone(inOutbox), dead...)))
		if len(all) != entries || all[0] != 1 || all[entries-1] != entries || len(slices.Compact(all)) != entries {
			t.Fatalf("after kill %d: %d in the outbox and %d dead letters, not each of %d entries once", kill, len(inOutbox), len(dead), entries)
		}
		if len(dead) < committed {
			t.Fatalf("after kill %d: %d dead letters, but the child saw %d moves committed", kill, len(dead), committed)
		}
		committed = len(dead)
		if testing.Short() && kill >= 3 {
			break
		}
	}
}

// moveChild moves the outbox's entries to the dead letters one by one,
// printing how many are committed, until killed.
func moveChild(path string) {
	db, err := Open(path, Options{LockTimeout: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	info, err := db.DeadLetterInfo("cloud")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	n := info.Count
	fmt.Println(n)
	var seqs []*OutboxEntry
	_ = db.OutboxScan("cloud", 0, 0, func(e *OutboxEntry) bool { seqs = append(seqs, e); return true })
	for _, e := range seqs {
		var b Batch
		b.OutboxDelete("cloud", e.Seq)
		b.DeadLetterPut("cloud", &DeadLetter{Seq: e.Seq, Entry: *e, Reason: "refused", At: time.Now().UnixNano(), Failures: 3})
		if err := db.CommitWait(&b); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		n++
		fmt.Println(n)
	}
	db.Close()
	os.Exit(0)
}
