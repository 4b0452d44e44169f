package bridge

import (
	"slices"
	"sync"
	"testing"

	"github.com/fieldgate/fieldgate/storage"
)

// tableSeqs returns the sequences t holds, sorted, and checks that byPID
// indexes only flights that bySeq holds, under their own identifier.
func tableSeqs(tb testing.TB, t *flightTable) []uint64 {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	var seqs []uint64
	for seq, f := range t.bySeq {
		if f.seq != seq {
			tb.Errorf("flight of entry %d is under %d", f.seq, seq)
		}
		seqs = append(seqs, seq)
	}
	for pid, f := range t.byPID {
		if f.pid != pid || t.bySeq[f.seq] != f {
			tb.Errorf("packet id %d indexes entry %d (pid %d), which the table does not hold so", pid, f.seq, f.pid)
		}
	}
	slices.Sort(seqs)
	return seqs
}

func TestFlightTableTrack(t *testing.T) {
	ft := newFlightTable()
	a := &outFlight{seq: 1, pid: 7}
	b := &outFlight{seq: 2} // the client picks its identifier
	ft.track(a)
	ft.track(b)
	if got := tableSeqs(t, ft); !slices.Equal(got, []uint64{1, 2}) || ft.len() != 2 {
		t.Fatalf("tracked %v (len %d), want [1 2]", got, ft.len())
	}
	if ft.byPID[0] != nil {
		t.Error("a flight without an identifier is indexed under 0")
	}
	ft.setPID(b, 9)
	ft.setPID(a, 8) // a has its identifier: unchanged
	if b.pid != 9 || ft.byPID[9] != b || a.pid != 7 || ft.byPID[8] != nil {
		t.Errorf("after setPID: a.pid %d, b.pid %d, byPID %v", a.pid, b.pid, ft.byPID)
	}

	// Identifier 7 goes to a newer flight before the older one is
	// untracked: the index keeps the newer.
	c := &outFlight{seq: 3, pid: 7}
	ft.track(c)
	ft.untrack(1)
	if ft.byPID[7] != c {
		t.Errorf("byPID[7] = %+v after the older flight left, want entry 3", ft.byPID[7])
	}
	ft.untrack(2)
	ft.untrack(42) // unknown: nothing happens
	if got := tableSeqs(t, ft); !slices.Equal(got, []uint64{3}) {
		t.Errorf("tracked %v, want [3]", got)
	}
	ft.markRecd(3)
	ft.markRecd(2) // gone: nothing happens
	if !c.recd {
		t.Error("markRecd did not mark entry 3")
	}
}

func TestFlightTableTakeAllRestore(t *testing.T) {
	ft := newFlightTable()
	for seq := range uint64(3) {
		ft.track(&outFlight{seq: seq + 1, pid: uint16(seq + 10)})
	}
	ft.pubrec(10)
	taken := ft.takeAll()
	if len(taken) != 3 || ft.len() != 0 || len(ft.byPID) != 0 {
		t.Fatalf("takeAll took %d and left %d (%d by id), want 3 and none", len(taken), ft.len(), len(ft.byPID))
	}
	if r := ft.takeReceipts(); len(r.pids) != 0 {
		t.Errorf("PUBRECs %v survived takeAll; they belong to the link that got them", r.pids)
	}

	// A failed resume gives back what it did not resend; an entry
	// resent meanwhile keeps its new flight.
	newer := &outFlight{seq: 2, pid: 20}
	ft.track(newer)
	ft.restore(taken)
	if got := tableSeqs(t, ft); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("after restore %v, want [1 2 3]", got)
	}
	if ft.bySeq[2] != newer {
		t.Errorf("restore replaced the flight of entry 2 tracked since")
	}
	if ft.byPID[10] != nil || ft.byPID[12] != nil {
		t.Error("restored flights are indexed by identifier; they wait for the next link's resume")
	}
}

func TestFlightTableStamps(t *testing.T) {
	ft := newFlightTable()
	if s := ft.nextStamp(); s != 1 {
		t.Errorf("first stamp %d, want 1", s)
	}
	ft.stampAfter(41)
	ft.stampAfter(5) // older records: no step back
	if s := ft.nextStamp(); s != 42 {
		t.Errorf("stamp after a record of 41: %d, want 42", s)
	}
	ft.track(&outFlight{seq: 1, pid: 1})
	ft.pubrec(1)
	r := ft.takeReceipts()
	if len(r.records) != 1 || r.records[0].Stamp != 43 {
		t.Errorf("receipt records %+v, want one stamped 43", r.records)
	}
	if s := ft.nextStamp(); s != 44 {
		t.Errorf("stamp after a receipt: %d, want 44", s)
	}
}

func TestFlightTableReceipts(t *testing.T) {
	ft := newFlightTable()
	a := &outFlight{seq: 5, pid: 1, recorded: true}
	b := &outFlight{seq: 6, pid: 2, recorded: true}
	ft.track(a)
	ft.track(b)
	for _, pid := range []uint16{2, 99, 1} {
		ft.pubrec(pid)
	}
	r := ft.takeReceipts()
	want := []storage.OutboxFlight{
		{Seq: 6, PID: 2, Released: true, Stamp: 1},
		{Seq: 5, PID: 1, Released: true, Stamp: 2},
	}
	if !slices.Equal(r.pids, []uint16{2, 99, 1}) || !slices.Equal(r.strays, []uint16{99}) ||
		!slices.Equal(r.flights, []*outFlight{b, a}) || !slices.Equal(r.records, want) {
		t.Fatalf("receipts %+v, want PUBRECs 2 99 1, stray 99, records %+v", r, want)
	}
	if a.released || b.released {
		t.Fatal("released before the records were committed")
	}
	if again := ft.takeReceipts(); len(again.pids) != 0 {
		t.Errorf("taken twice: %v", again.pids)
	}

	// The records failed: the PUBRECs go back ahead of a newer one.
	ft.pubrec(3)
	ft.requeue(r.pids)
	if again := ft.takeReceipts(); !slices.Equal(again.pids, []uint16{2, 99, 1, 3}) {
		t.Errorf("after requeue %v, want 2 99 1 then 3", again.pids)
	}
	ft.markReleased(r.flights)
	if !a.released || !b.released {
		t.Error("markReleased left a flight unreleased")
	}
}

// TestFlightTableConcurrent runs the send loop's and the client's calls
// at once, for the race detector.
func TestFlightTableConcurrent(t *testing.T) {
	ft := newFlightTable()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the client's callbacks
		defer wg.Done()
		for i := range 1000 {
			ft.pubrec(uint16(i%50 + 1))
			ft.markRecd(uint64(i))
			ft.untrack(uint64(i))
		}
	}()
	go func() { // the send loop
		defer wg.Done()
		for i := range 1000 {
			f := &outFlight{seq: uint64(i)}
			ft.track(f)
			ft.setPID(f, uint16(i%50+1))
			if i%10 == 0 {
				r := ft.takeReceipts()
				ft.markReleased(r.flights)
			}
			_ = ft.nextStamp()
		}
	}()
	wg.Wait()
}

// BenchmarkFlightTable is one QoS 1 message's way through the table: it
// is tracked, given the identifier the client picked, and untracked on
// its PUBACK.
func BenchmarkFlightTable(b *testing.B) {
	ft := newFlightTable()
	b.ReportAllocs()
	var seq uint64
	for b.Loop() {
		seq++
		f := &outFlight{seq: seq}
		ft.track(f)
		ft.setPID(f, uint16(seq%65535+1))
		ft.untrack(seq)
	}
}
