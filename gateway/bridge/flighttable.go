package bridge

import (
	"sync"

	"github.com/fieldgate/fieldgate/storage"
)

// flightTable holds the outbox entries handed to the current or last link,
// by sequence and by packet identifier. After a reconnect with the session
// present they are resent with those identifiers [MQTT-4.4.0-1], so that
// the server's QoS 2 state still matches; QoS 2 flights are also recorded
// in storage, before each PUBLISH and each PUBREL, so that this holds
// across a restart too, and the table stamps those records. It also queues
// the PUBRECs whose PUBREL waits for its record. The run goroutine and the
// client's callbacks share it: its methods are safe for concurrent use.
type flightTable struct {
	mu    sync.Mutex
	bySeq map[uint64]*outFlight
	byPID map[uint16]*outFlight // the same flights, by packet identifier
	recs  []uint16              // PUBRECs whose PUBREL waits for its record
	stamp uint64                // the next flight record's stamp
}

// outFlight is one outbox entry in flight upstream. The table's lock
// guards its fields while the table holds it; takeAll hands it to the
// caller alone.
type outFlight struct {
	seq      uint64
	pid      uint16
	link     uint64 // the link it was last sent on (loop.link)
	recorded bool   // QoS 2: its record (pid, not released) is in storage
	recd     bool   // QoS 2: PUBREC came; PUBREL waits until released is recorded
	released bool   // QoS 2: PUBREC came and is recorded; PUBREL is what to resend
}

func newFlightTable() *flightTable {
	return &flightTable{bySeq: map[uint64]*outFlight{}, byPID: map[uint16]*outFlight{}, stamp: 1}
}

// len returns the number of flights.
func (t *flightTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.bySeq)
}

// track adds f, under its packet identifier too when it has one.
func (t *flightTable) track(f *outFlight) {
	t.mu.Lock()
	t.bySeq[f.seq] = f
	if f.pid != 0 {
		t.byPID[f.pid] = f
	}
	t.mu.Unlock()
}

// untrack forgets entry seq's flight. Its identifier stays with a newer
// flight that took it since.
func (t *flightTable) untrack(seq uint64) {
	t.mu.Lock()
	if f := t.bySeq[seq]; f != nil && t.byPID[f.pid] == f {
		delete(t.byPID, f.pid)
	}
	delete(t.bySeq, seq)
	t.mu.Unlock()
}

// received reports whether entry seq is tracked past its PUBREC: the
// server has it, and what is due is its PUBREL.
func (t *flightTable) received(seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.bySeq[seq]
	return f != nil && (f.recd || f.released)
}

// setPID gives f, tracked without a packet identifier (the client picked
// one as it published), the identifier pid.
func (t *flightTable) setPID(f *outFlight, pid uint16) {
	t.mu.Lock()
	if f.pid == 0 && pid != 0 {
		f.pid = pid
		t.byPID[pid] = f
	}
	t.mu.Unlock()
}

// markRecd notes that entry seq's PUBREC came before its link ended:
// what the next link resends is its PUBREL.
func (t *flightTable) markRecd(seq uint64) {
	t.mu.Lock()
	if f := t.bySeq[seq]; f != nil {
		f.recd = true
	}
	t.mu.Unlock()
}

// takeAll empties the table for a new link and returns its flights by
// sequence; the PUBRECs still queued went with the link that got them.
func (t *flightTable) takeAll() map[uint64]*outFlight {
	t.mu.Lock()
	defer t.mu.Unlock()
	flights := t.bySeq
	t.bySeq, t.byPID, t.recs = map[uint64]*outFlight{}, map[uint16]*outFlight{}, nil
	return flights
}

// restore gives back flights from takeAll that a failed resume did not
// resend, for the next link to resume; an entry tracked again meanwhile
// keeps its newer flight.
func (t *flightTable) restore(flights map[uint64]*outFlight) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for seq, f := range flights {
		if _, taken := t.bySeq[seq]; !taken {
			t.bySeq[seq] = f
		}
	}
}

// nextStamp returns the stamp of the next flight record: a record with a
// higher stamp holding the same identifier is the newer one.
func (t *flightTable) nextStamp() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stamp++
	return t.stamp - 1
}

// stampAfter makes the next stamp higher than stamp, one found in storage.
func (t *flightTable) stampAfter(stamp uint64) {
	t.mu.Lock()
	t.stamp = max(t.stamp, stamp+1)
	t.mu.Unlock()
}

// pubrec queues the PUBREC of pid; its PUBREL waits until the send loop
// has recorded it (takeReceipts).
func (t *flightTable) pubrec(pid uint16) {
	t.mu.Lock()
	t.recs = append(t.recs, pid)
	t.mu.Unlock()
}

// receipts are the PUBRECs that takeReceipts took.
type receipts struct {
	pids    []uint16               // all of them, in order, for requeue
	flights []*outFlight           // the flights they belong to
	records []storage.OutboxFlight // each flight's record as released, stamped
	strays  []uint16               // identifiers of no flight: nothing to record
}

// takeReceipts takes the PUBRECs queued since the last call, with the
// records that say their flights were received.
func (t *flightTable) takeReceipts() receipts {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := receipts{pids: t.recs}
	t.recs = nil
	for _, pid := range r.pids {
		if f := t.byPID[pid]; f != nil {
			t.stamp++
			r.records = append(r.records, storage.OutboxFlight{Seq: f.seq, PID: pid, Released: true, Stamp: t.stamp - 1})
			r.flights = append(r.flights, f)
		} else {
			r.strays = append(r.strays, pid)
		}
	}
	return r
}

// requeue puts back PUBRECs from takeReceipts whose records failed, ahead
// of any queued since.
func (t *flightTable) requeue(pids []uint16) {
	t.mu.Lock()
	t.recs = append(pids, t.recs...)
	t.mu.Unlock()
}

// markReleased notes that the PUBRECs of flights are recorded: each one's
// PUBREL is what to send, now and after a reconnect.
func (t *flightTable) markReleased(flights []*outFlight) {
	t.mu.Lock()
	for _, f := range flights {
		f.released = true
	}
	t.mu.Unlock()
}

// has reports whether entry seq is tracked.
func (t *flightTable) has(seq uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bySeq[seq] != nil
}

// lowestSentOn returns the lowest entry sent on link, under an
// identifier, that the server has not acknowledged, not even with a
// PUBREC: the message the link most likely ended on.
func (t *flightTable) lowestSentOn(link uint64) (seq uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for s, f := range t.bySeq {
		if f.link == link && f.pid != 0 && !f.recd && !f.released && (!ok || s < seq) {
			seq, ok = s, true
		}
	}
	return seq, ok
}

// unreceived returns the entries recorded as QoS 2 flights that no
// PUBREC answered.
func (t *flightTable) unreceived() []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var seqs []uint64
	for s, f := range t.bySeq {
		if f.recorded && !f.recd && !f.released {
			seqs = append(seqs, s)
		}
	}
	return seqs
}

// unrecord notes that the records of entries seqs were deleted.
func (t *flightTable) unrecord(seqs []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range seqs {
		if f := t.bySeq[s]; f != nil {
			f.recorded = false
		}
	}
}
