package storage

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	bolt "go.etcd.io/bbolt"
)

func queued(seq uint64, payload string) *Queued {
	return &Queued{Seq: seq, Msg: Message{Topic: "q/" + payload, Payload: []byte(payload), QoS: 1}}
}

func seqs(q []Queued) []uint64 {
	var s []uint64
	for _, m := range q {
		s = append(s, m.Seq)
	}
	return s
}

func TestBatchLoad(t *testing.T) {
	db := openTemp(t, Options{})
	will := &Will{Msg: Message{Topic: "dev1/status", Payload: []byte("gone"), QoS: 1, Retain: true}, Delay: 10 * time.Second}
	sessions := []Session{
		{ClientID: "dev", User: "u", Expiry: time.Hour},
		{ClientID: "dev1", Expiry: time.Minute, ExpireAt: time.Unix(1_900_000_000, 0), Will: will},
		{ClientID: "de"},
	}
	// Sessions, subscriptions and queues of all three arrive in separate
	// batches, the queue out of order; Load must sort it by sequence.
	for _, s := range sessions {
		commit(t, db, func(b *Batch) {
			b.PutSession(&s)
			b.PutSub(s.ClientID, Sub{Filter: "a/#", Opts: 1, ID: 7})
			b.PutSub(s.ClientID, Sub{Filter: "b/+/c", Opts: 0x22})
			b.PutSub(s.ClientID, Sub{Filter: "gone"})
		})
	}
	for _, seq := range []uint64{256, 1, 1 << 40, 2, 255} {
		var b Batch
		for _, s := range sessions {
			b.Enqueue(s.ClientID, queued(seq, fmt.Sprint(s.ClientID, seq)))
		}
		done := make(chan error, 1)
		db.Commit(&b, func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	commit(t, db, func(b *Batch) {
		for _, s := range sessions {
			b.DeleteSub(s.ClientID, "gone")
			b.SetInflight(s.ClientID, 2, 17, false)
			b.SetInflight(s.ClientID, 255, 18, true)
			b.SetInflight(s.ClientID, 99, 19, true) // never queued: nothing to patch
			b.Dequeue(s.ClientID, 1)
			b.AddAwaitingRel(s.ClientID, 300)
			b.AddAwaitingRel(s.ClientID, 5)
			b.AddAwaitingRel(s.ClientID, 9)
			b.DeleteAwaitingRel(s.ClientID, 5)
		}
	})

	check := func(db *DB, ids ...string) {
		t.Helper()
		all := loadAll(t, db)
		if len(all) != len(ids) {
			t.Fatalf("loaded %d sessions, want %q", len(all), ids)
		}
		for _, want := range sessions {
			if !slices.Contains(ids, want.ClientID) {
				continue
			}
			st := all[want.ClientID]
			if st == nil {
				t.Fatalf("session %q missing", want.ClientID)
			}
			sameSession(t, &st.Session, &want)
			wantSubs := []Sub{{Filter: "a/#", Opts: 1, ID: 7}, {Filter: "b/+/c", Opts: 0x22}}
			if !reflect.DeepEqual(st.Subs, wantSubs) {
				t.Errorf("%s: subs %+v, want %+v", want.ClientID, st.Subs, wantSubs)
			}
			if got, w := seqs(st.Queue), []uint64{2, 255, 256, 1 << 40}; !reflect.DeepEqual(got, w) {
				t.Errorf("%s: queue %v, want %v", want.ClientID, got, w)
			}
			for _, q := range st.Queue {
				pid, rec := map[uint64]uint16{2: 17, 255: 18}[q.Seq], q.Seq == 255
				if q.PID != pid || q.Rec != rec {
					t.Errorf("%s: seq %d pid/rec %d/%t, want %d/%t", want.ClientID, q.Seq, q.PID, q.Rec, pid, rec)
				}
				if d := sameMessage(&q.Msg, &queued(q.Seq, fmt.Sprint(want.ClientID, q.Seq)).Msg); d != "" {
					t.Errorf("%s: seq %d: %s", want.ClientID, q.Seq, d)
				}
			}
			if !reflect.DeepEqual(st.AwaitingRel, []uint16{9, 300}) {
				t.Errorf("%s: awaiting %v, want [9 300]", want.ClientID, st.AwaitingRel)
			}
		}
	}
	check(db, "de", "dev", "dev1")

	// Deleting "dev" takes everything of dev and nothing of "dev1" or
	// "de", whose ids share its first bytes.
	bytesBefore := db.QueuedBytes()
	commit(t, db, func(b *Batch) { b.DeleteSession("dev") })
	check(db, "de", "dev1")
	for _, bk := range [][]byte{bucketSessions, bucketSubs, bucketQueue, bucketRel} {
		for _, k := range rawKeys(t, db, bk) {
			if k == "dev" || strings.HasPrefix(k, "dev\x00") {
				t.Errorf("bucket %s still holds %q", bk, k)
			}
		}
	}
	if got := db.QueuedBytes(); got >= bytesBefore || got != rawSum(t, db) {
		t.Errorf("queued bytes %d after deleting a session, had %d; the queue bucket holds %d", got, bytesBefore, rawSum(t, db))
	}
	if problems := db.Check(); len(problems) > 0 {
		t.Errorf("check: %q", problems)
	}

	// Everything survives a reopen, and the queued bytes are counted again
	// from the file.
	want := db.QueuedBytes()
	db = reopen(t, db, Options{})
	check(db, "de", "dev1")
	if got := db.QueuedBytes(); got != want {
		t.Errorf("queued bytes %d after reopen, %d before", got, want)
	}
	if n := rawSum(t, db); n != want {
		t.Errorf("queued bytes %d, the queue bucket holds %d", want, n)
	}
}

// rawSum adds up the values in the queue bucket.
func rawSum(t *testing.T, db *DB) int64 {
	t.Helper()
	var n int64
	err := db.bolt.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketQueue).ForEach(func(_, v []byte) error {
			n += int64(len(v))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestCommitEmptyAndClosed(t *testing.T) {
	db := openTemp(t, Options{})
	called := false
	db.Commit(&Batch{}, func(err error) { called = err == nil })
	db.Commit(nil, nil)
	db.CommitLazy(nil)
	if !called {
		t.Fatal("an empty batch did not complete at once")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	var b Batch
	b.DeleteRetained("t")
	errIs(t, db.CommitWait(&b), ErrClosed)
	db.CommitLazy(&b) // must neither block nor panic
}

// TestCommitInvalidAlone: a batch bbolt cannot store fails alone; the
// batches grouped with it commit.
func TestCommitInvalidAlone(t *testing.T) {
	db := openTemp(t, Options{})
	bad := []struct {
		name  string
		build func(b *Batch)
	}{
		{"empty topic", func(b *Batch) { b.SetRetained(&Message{}) }},
		{"topic over 32 KiB", func(b *Batch) { b.SetRetained(&Message{Topic: strings.Repeat("t", 40_000)}) }},
		{"client id over 32 KiB", func(b *Batch) { b.PutSession(&Session{ClientID: strings.Repeat("c", 65_535)}) }},
		{"sub key over 32 KiB", func(b *Batch) { b.PutSub(strings.Repeat("c", 20_000), Sub{Filter: strings.Repeat("f", 20_000)}) }},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make([]error, 20)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var b Batch
					if i == 10 {
						tc.build(&b)
					} else {
						b.SetRetained(&Message{Topic: fmt.Sprintf("ok/%d", i), Payload: []byte("v")})
					}
					errs[i] = db.CommitWait(&b)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if i == 10 {
					errIs(t, err, ErrInvalidWrite)
				} else if err != nil {
					t.Errorf("batch %d grouped with an invalid one failed: %v", i, err)
				}
			}
		})
	}
	lost := db.CommitStats().LazyLost
	var b Batch
	b.SetRetained(&Message{})
	db.CommitLazy(&b)
	if got := db.CommitStats().LazyLost; got != lost+1 {
		t.Errorf("an invalid lazy batch counted %d lost, want %d", got-lost, 1)
	}
}

// TestGroupCommit: batches committed together share transactions, each
// caller learns its own outcome, and everything is there afterwards.
func TestGroupCommit(t *testing.T) {
	db := openTemp(t, Options{})
	const n = 200
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("client-%03d", i)
			var b Batch
			b.PutSession(&Session{ClientID: id, Expiry: time.Hour})
			b.PutSub(id, Sub{Filter: id + "/#", Opts: 1})
			b.Enqueue(id, queued(1, id))
			b.SetRetained(&Message{Topic: id, Payload: []byte(id)})
			<-start
			errs[i] = db.CommitWait(&b)
		}()
	}
	before := db.CommitStats()
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	st := db.CommitStats()
	commits, batches := st.Commits-before.Commits, st.Batches-before.Batches
	t.Logf("%d batches from %d goroutines in %d commits (%.1f batches per fsync), %v committing", batches, n, commits, float64(batches)/float64(commits), st.Time-before.Time)
	if batches != n {
		t.Errorf("%d batches counted, want %d", batches, n)
	}
	if commits >= n {
		t.Errorf("%d commits for %d concurrent batches: nothing was grouped", commits, n)
	}
	all := loadAll(t, db)
	if len(all) != n {
		t.Fatalf("%d sessions stored, want %d", len(all), n)
	}
	for id, s := range all {
		if len(s.Subs) != 1 || len(s.Queue) != 1 || string(s.Queue[0].Msg.Payload) != id {
			t.Errorf("%s: stored %+v", id, s)
		}
	}
	if got := db.RetainedCount(); got != n {
		t.Errorf("%d retained, want %d", got, n)
	}
}

// TestCommitOrder: batches one goroutine commits in sequence apply in that
// order, and their callbacks run in that order, grouped or not.
func TestCommitOrder(t *testing.T) {
	db := openTemp(t, Options{})
	const rounds = 300
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range rounds {
		var b Batch
		key := fmt.Sprintf("k/%d", i%7)
		switch i % 3 {
		case 0, 1:
			b.SetRetained(&Message{Topic: key, Payload: []byte(fmt.Sprint(i))})
		case 2:
			b.DeleteRetained(key)
		}
		wg.Add(1)
		db.Commit(&b, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		})
	}
	// A put then a delete of the same key, in one goroutine: deleted.
	var put, del Batch
	put.SetRetained(&Message{Topic: "last", Payload: []byte("x")})
	del.DeleteRetained("last")
	db.Commit(&put, nil)
	if err := db.CommitWait(&del); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("callbacks ran in order %v", order)
		}
	}
	if m, err := db.Retained("last"); err != nil || m != nil {
		t.Fatalf("put then delete left %+v, %v", m, err)
	}
	// The final state is the last write to each key.
	for k := range 7 {
		var last = -1
		for i := range rounds {
			if i%7 == k {
				last = i
			}
		}
		m, err := db.Retained(fmt.Sprintf("k/%d", k))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case last%3 == 2 && m != nil:
			t.Errorf("k/%d: %q left after its last write deleted it", k, m.Payload)
		case last%3 != 2 && (m == nil || string(m.Payload) != fmt.Sprint(last)):
			t.Errorf("k/%d: %+v, want payload %d", k, m, last)
		}
	}
	st := db.CommitStats()
	t.Logf("%d batches in %d commits", st.Batches, st.Commits)
}

// TestCommitCallbackCommits: a callback may commit again (without
// waiting); the committer takes that batch in its next transaction.
func TestCommitCallbackCommits(t *testing.T) {
	db := openTemp(t, Options{})
	got := make(chan error, 1)
	var first Batch
	first.SetRetained(&Message{Topic: "a", Payload: []byte("1")})
	db.Commit(&first, func(err error) {
		var second Batch
		second.SetRetained(&Message{Topic: "b", Payload: []byte("2")})
		db.Commit(&second, func(err error) { got <- err })
	})
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testkit.Scale(10 * time.Second)):
		t.Fatal("a commit from a callback never completed")
	}
	if m, _ := db.Retained("b"); m == nil {
		t.Fatal("commit from a callback not applied")
	}
}

func TestCommitLazy(t *testing.T) {
	t.Run("alone within LazyDelay", func(t *testing.T) {
		const delay = 150 * time.Millisecond
		db := openTemp(t, Options{LazyDelay: delay})
		before := db.CommitStats()
		var b Batch
		b.SetRetained(&Message{Topic: "sensor/1", Payload: []byte("21.5")})
		start := time.Now()
		db.CommitLazy(&b)
		for {
			m, err := db.Retained("sensor/1")
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			if m != nil {
				if elapsed < delay {
					t.Fatalf("lazy batch applied after %v, before its delay of %v", elapsed, delay)
				}
				t.Logf("lazy batch applied after %v", elapsed)
				break
			}
			if elapsed > delay+testkit.Scale(5*time.Second) {
				t.Fatalf("lazy batch not applied %v after its delay", elapsed)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// The data shows as soon as the transaction commits, the counters
		// a moment later: a lazy batch has no callback to wait for.
		st := db.CommitStats()
		for deadline := time.Now().Add(testkit.Scale(5 * time.Second)); st.Commits == before.Commits && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			st = db.CommitStats()
		}
		if st.Commits != before.Commits+1 || st.Batches != before.Batches+1 {
			t.Errorf("commits/batches +%d/+%d, want +1/+1", st.Commits-before.Commits, st.Batches-before.Batches)
		}
	})

	t.Run("rides with a durable commit", func(t *testing.T) {
		db := openTemp(t, Options{LazyDelay: time.Hour})
		before := db.CommitStats()
		for i := range 3 {
			var b Batch
			b.SetRetained(&Message{Topic: fmt.Sprintf("lazy/%d", i), Payload: []byte("v")})
			db.CommitLazy(&b)
		}
		time.Sleep(30 * time.Millisecond)
		if m, _ := db.Retained("lazy/0"); m != nil {
			t.Fatal("lazy batch applied on its own within an hour's delay")
		}
		if st := db.CommitStats(); st.Commits != before.Commits {
			t.Fatalf("lazy batches committed on their own: %+v", st)
		}
		commit(t, db, func(b *Batch) { b.SetRetained(&Message{Topic: "durable", Payload: []byte("v")}) })
		for _, topic := range []string{"lazy/0", "lazy/1", "lazy/2", "durable"} {
			if m, err := db.Retained(topic); err != nil || m == nil {
				t.Errorf("%s: %v %v after the durable commit", topic, m, err)
			}
		}
		st := db.CommitStats()
		if st.Commits != before.Commits+1 || st.Batches != before.Batches+4 {
			t.Errorf("commits/batches +%d/+%d, want +1/+4", st.Commits-before.Commits, st.Batches-before.Batches)
		}
	})

	t.Run("written at close", func(t *testing.T) {
		db := openTemp(t, Options{LazyDelay: time.Hour})
		var b Batch
		b.SetRetained(&Message{Topic: "at/close", Payload: []byte("v")})
		db.CommitLazy(&b)
		db = reopen(t, db, Options{})
		if m, err := db.Retained("at/close"); err != nil || m == nil {
			t.Fatalf("lazy batch lost at close: %v %v", m, err)
		}
	})
}

// TestCommitConcurrentReaders: reads run while commits do, without races
// and without seeing half a batch.
func TestCommitConcurrentReaders(t *testing.T) {
	db := openTemp(t, Options{})
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			// Each batch writes a pair with the same payload: a reader sees
			// both or neither.
			var topics [2][]byte
			err := db.MatchRetained("pair/#", func(f, topic string) bool { return true }, func(m *Message) {
				topics[strings.Count(m.Topic, "/")-1] = m.Payload
			})
			if err != nil {
				bad.Store(err)
				return
			}
			if !bytes.Equal(topics[0], topics[1]) {
				bad.Store(fmt.Errorf("half a batch seen: %q %q", topics[0], topics[1]))
				return
			}
		}
	}()
	for i := range 200 {
		p := []byte(fmt.Sprint(i))
		commit(t, db, func(b *Batch) {
			b.SetRetained(&Message{Topic: "pair/a", Payload: p})
			b.SetRetained(&Message{Topic: "pair/a/b", Payload: p})
		})
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
}

// TestAfter: After's callback runs once everything committed before it is
// done, in order with the commits' callbacks, without a transaction of
// its own.
func TestAfter(t *testing.T) {
	db := openTemp(t, Options{})
	var mu sync.Mutex
	var order []string
	note := func(s string) func(error) {
		return func(err error) {
			if err != nil {
				t.Errorf("%s: %v", s, err)
			}
			mu.Lock()
			order = append(order, s)
			mu.Unlock()
		}
	}
	before := db.CommitStats()
	var a, b Batch
	a.SetRetained(&Message{Topic: "a"})
	b.SetRetained(&Message{Topic: "b"})
	db.Commit(&a, note("a"))
	db.Commit(&b, note("b"))
	done := make(chan error, 1)
	db.After(func(err error) { note("after")(err); done <- err })
	<-done
	if got := strings.Join(order, " "); got != "a b after" {
		t.Errorf("callbacks ran as %q", got)
	}
	if m, _ := db.Retained("b"); m == nil {
		t.Error("After completed before the commit before it was applied")
	}
	commits := db.CommitStats().Commits - before.Commits
	db.After(func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := db.CommitStats().Commits - before.Commits; got != commits {
		t.Errorf("After alone made %d transactions", got-commits)
	}

	db.Close()
	db.After(func(err error) { done <- err })
	select {
	case err := <-done:
		errIs(t, err, ErrClosed)
	case <-time.After(testkit.Scale(10 * time.Second)):
		t.Fatal("After on a closed DB never called back")
	}
}

func TestBatchBytes(t *testing.T) {
	var nilBatch *Batch
	if nilBatch.Bytes() != 0 || !nilBatch.Empty() {
		t.Error("nil batch")
	}
	var b Batch
	b.SetRetained(&Message{Topic: "abc", Payload: []byte("12345")})
	want := 3 + len(appendMessage(nil, &Message{Topic: "abc", Payload: []byte("12345")}))
	if b.Bytes() != want || b.Len() != 1 {
		t.Errorf("bytes %d len %d, want %d 1", b.Bytes(), b.Len(), want)
	}
	var c Batch
	c.DeleteRetained("abc")
	c.Append(&b)
	c.Append(nil)
	if c.Bytes() != want || c.Len() != 2 {
		t.Errorf("appended: bytes %d len %d, want %d 2", c.Bytes(), c.Len(), want)
	}
}

// TestLoadCallerPanic: a panic in Load's callback is the caller's and
// comes back as such, not as a damaged file.
func TestLoadCallerPanic(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) { b.PutSession(&Session{ClientID: "c"}) })
	defer func() {
		if r := recover(); r != "caller's own" {
			t.Fatalf("recovered %v, want the callback's panic", r)
		}
		// The read transaction ended: commits still work.
		commit(t, db, func(b *Batch) { b.DeleteSession("c") })
	}()
	_ = db.Load(func(*SessionState) error { panic("caller's own") })
	t.Fatal("Load returned")
}
