package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/storage"
)

// parked is a bridge on a state file that is never started: its link is
// down, as when the run goroutine moves an entry to the dead letters.
type parked struct {
	t    *testing.T
	path string
	db   *storage.DB
	br   *Bridge
	log  *testkit.Buffer
}

// newParked makes a bridge named cloud of bridgeYAML (one list item's
// body, indented four spaces) on the state file at path ("": a new one).
func newParked(t *testing.T, bridgeYAML, path string) *parked {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "state.db")
	}
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := &parked{t: t, path: path, db: db, log: &testkit.Buffer{}}
	cfg := parseBridge(t, "bridges:\n  - name: cloud\n    address: \"127.0.0.1:1\"\n"+bridgeYAML)
	p.br, err = New(cfg, Options{Device: "gw1", Store: db, Log: slog.New(slog.NewTextHandler(p.log, nil))})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { p.db.Close() })
	return p
}

// restart closes the state file and makes the bridge again on it.
func (p *parked) restart(bridgeYAML string) *parked {
	p.t.Helper()
	if err := p.db.Close(); err != nil {
		p.t.Fatal(err)
	}
	return newParked(p.t, bridgeYAML, p.path)
}

// queue offers local messages to the bridge and commits them, as the
// broker does for a QoS 1 publish.
func (p *parked) queue(topic string, payloads ...string) {
	p.t.Helper()
	for _, pl := range payloads {
		var b storage.Batch
		if err := p.br.Offer(topic, []byte(pl), false, "sensor", &b); err != nil {
			p.t.Fatalf("offer %s %s refused: %v", topic, pl, err)
		}
		if err := p.db.CommitWait(&b); err != nil {
			p.t.Fatal(err)
		}
	}
}

// outbox returns the outbox's entries, in order.
func (p *parked) outbox() []storage.OutboxEntry {
	p.t.Helper()
	var out []storage.OutboxEntry
	if err := p.db.OutboxScan("cloud", 0, 0, func(e *storage.OutboxEntry) bool { out = append(out, *e); return true }); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// payloads returns the entries' payloads.
func payloads(entries []storage.OutboxEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, string(e.Msg.Payload))
	}
	return out
}

// dead returns the bridge's dead letters' payloads and sequences.
func (p *parked) dead() (pls []string, seqs []uint64) {
	p.t.Helper()
	all, err := p.br.DeadLetters(0)
	if err != nil {
		p.t.Fatal(err)
	}
	for _, d := range all {
		pls = append(pls, string(d.Entry.Msg.Payload))
		seqs = append(seqs, d.Seq)
	}
	return pls, seqs
}

// moveByPayload moves the outbox entry holding payload to the dead letters.
func (p *parked) moveByPayload(payload, reason string) {
	p.t.Helper()
	for _, e := range p.outbox() {
		if string(e.Msg.Payload) == payload {
			if err := p.br.deadLetterAfter(e, reason, 3); err != nil {
				p.t.Fatal(err)
			}
			return
		}
	}
	p.t.Fatalf("no outbox entry holds %q", payload)
}

const deadRoutes = `    out:
      - {filter: "data/#", topic: "up/{2}"}
      - {filter: "alarm/#", topic: "alarm/{2}", class: alarm}
      - {filter: "state/#", topic: "state/{2}", class: state}
`

// TestDeadLetterMove: an entry moved to the dead letters leaves the
// outbox and its counters, is counted and logged with its topic and
// reason, and keeps what it was; a QoS 2 flight record of it goes with it.
func TestDeadLetterMove(t *testing.T) {
	p := newParked(t, deadRoutes, "")
	p.queue("data/a", "1", "2", "3")
	before := p.br.Stats()
	entries := p.outbox()
	// The record a QoS 2 PUBLISH would have had on the link that failed.
	var rec storage.Batch
	rec.OutboxFlightPut("cloud", &storage.OutboxFlight{Seq: entries[1].Seq, PID: 5, Stamp: 1})
	if err := p.db.CommitWait(&rec); err != nil {
		t.Fatal(err)
	}
	if err := p.br.deadLetterAfter(entries[1], "server closed the link: invalid topic", 3); err != nil {
		t.Fatal(err)
	}
	if got := payloads(p.outbox()); !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("outbox %v, want 1 and 3", got)
	}
	if set, _ := p.db.OutboxFlights("cloud"); len(set.Flights) != 0 {
		t.Errorf("flight records %+v left behind", set.Flights)
	}
	st := p.br.Stats()
	size := int64(entries[1].Size())
	if st.Depth != 2 || st.Bytes != before.Bytes-size || st.DeadLetters != 1 || st.DeadLettered != 1 || st.DeadLetterBytes <= size {
		t.Errorf("stats %+v; want depth 2, bytes %d, one dead letter", st, before.Bytes-size)
	}
	all, err := p.br.DeadLetters(10)
	if err != nil || len(all) != 1 {
		t.Fatalf("dead letters %+v, %v", all, err)
	}
	d := all[0]
	if d.Seq != 1 || d.Reason != "server closed the link: invalid topic" || d.Failures != 3 || d.At == 0 ||
		d.Entry.Seq != entries[1].Seq || d.Entry.Msg.Topic != "up/a" || string(d.Entry.Msg.Payload) != "2" || d.Entry.Added != entries[1].Added {
		t.Errorf("dead letter %+v", d)
	}
	if st.DeadLetterBytes != int64(d.Size()) {
		t.Errorf("dead letter bytes %d, want its size %d", st.DeadLetterBytes, d.Size())
	}
	logs := p.log.String()
	for _, want := range []string{"level=WARN", "dead letters", "topic=up/a", `reason="server closed the link: invalid topic"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log does not say %q:\n%s", want, logs)
		}
	}
	// Moved already: a second move is an error, and changes nothing.
	if err := p.br.deadLetter(entries[1], "again"); err == nil {
		t.Error("an entry moved twice")
	}
	if st := p.br.Stats(); st.DeadLetters != 1 || st.Depth != 2 {
		t.Errorf("after a second move: %+v", st)
	}
	// One received upstream is the server's: it is not moved.
	p.br.flights.track(&outFlight{seq: entries[2].Seq, pid: 9, recorded: true, released: true})
	if err := p.br.deadLetter(entries[2], "refused"); err == nil || !strings.Contains(err.Error(), "PUBREC") {
		t.Errorf("a released flight moved: %v", err)
	}
}

// TestDeadLetterRetryOrder: the uplink goes on behind the dead letters,
// and retried ones go to the end of the outbox, in the order they were
// moved (the link moves the head of the outbox each time, so that is the
// outbox's order), to a real upstream.
func TestDeadLetterRetryOrder(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{Persistence: true, AutosaveEvery: 1})
	w := watch(t, up.Addr(), "watcher", "up/#", true)
	up.Stop()
	s := newSite(t, bridgeYAML(up.Addr(), "    rate: 0\n"+deadRoutes), "")
	for i := 1; i <= 6; i++ {
		if err := s.publish("data/x", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var entries []storage.OutboxEntry
	_ = s.db.OutboxScan("cloud", 0, 0, func(e *storage.OutboxEntry) bool { entries = append(entries, *e); return true })
	if len(entries) != 6 {
		t.Fatalf("%d queued, want 6", len(entries))
	}
	for _, i := range []int{3, 1} { // moved out of the outbox's order: retried in the order moved
		if err := s.br.deadLetter(entries[i], "refused"); err != nil {
			t.Fatal(err)
		}
	}
	up.Start()
	waitFor(t, "the rest upstream", func() bool { return len(w.topics()["up/x"]) >= 4 })
	waitFor(t, "the outbox to empty", func() bool { return s.br.Stats().Depth == 0 })
	if got := firstSeen(w.topics()["up/x"]); !slices.Equal(got, []string{"1", "3", "5", "6"}) {
		t.Fatalf("upstream got %v, want 1 3 5 6 past the dead letters", got)
	}
	n, err := s.br.RetryDeadLetters(nil)
	if err != nil || n != 2 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	waitFor(t, "the retried upstream", func() bool { return len(uniq(w.topics()["up/x"])) == 6 })
	if got := firstSeen(w.topics()["up/x"]); !slices.Equal(got, []string{"1", "3", "5", "6", "4", "2"}) {
		t.Errorf("upstream got %v, want the retried 4 and 2 last, in the order they were moved", got)
	}
	if st := s.br.Stats(); st.DeadLetters != 0 || st.DeadLetterBytes != 0 || st.DeadLettered != 2 {
		t.Errorf("stats after the retry %+v", st)
	}
}

// TestDeadLetterBound: past max_dead_letter_bytes the oldest dead letters
// are dropped, counted and logged; one larger than the bound is dropped
// itself, counted and logged. None goes silently.
func TestDeadLetterBound(t *testing.T) {
	const cfg = "    max_outbox_bytes: 1048576\n    max_dead_letter_bytes: 65536\n" + deadRoutes
	p := newParked(t, cfg, "")
	big := strings.Repeat("x", 20000)
	for i := 1; i <= 4; i++ {
		p.queue("data/a", fmt.Sprint(i, big))
	}
	for i := 1; i <= 4; i++ {
		p.moveByPayload(fmt.Sprint(i, big), "refused")
	}
	pls, seqs := p.dead()
	if len(pls) != 3 || pls[0] != "2"+big || !slices.Equal(seqs, []uint64{2, 3, 4}) {
		t.Errorf("dead letters %v, want 2 to 4: the oldest dropped for room", seqs)
	}
	st := p.br.Stats()
	if st.Dropped[DropDeadLetterFull] != 1 || st.DeadLetters != 3 || st.DeadLettered != 4 || st.DeadLetterBytes > 65536 {
		t.Errorf("stats %+v", st)
	}
	if logs := p.log.String(); !strings.Contains(logs, "oldest dead letter dropped") || !strings.Contains(logs, "dead_letter=1") {
		t.Errorf("the dropped dead letter is not logged:\n%s", logs)
	}
	p.queue("data/a", strings.Repeat("y", 70000))
	p.moveByPayload(strings.Repeat("y", 70000), "refused")
	if _, seqs := p.dead(); !slices.Equal(seqs, []uint64{2, 3, 4}) {
		t.Errorf("dead letters %v after one larger than the bound", seqs)
	}
	if st := p.br.Stats(); st.Dropped[DropDeadLetterFull] != 2 || st.Depth != 0 {
		t.Errorf("stats %+v after one larger than the bound", st)
	}
	if logs := p.log.String(); !strings.Contains(logs, "larger than max_dead_letter_bytes") {
		t.Errorf("the one larger than the bound is not logged:\n%s", logs)
	}
}

// TestDeadLetterRestart: dead letters and their counts outlast a restart,
// and new ones are numbered after them.
func TestDeadLetterRestart(t *testing.T) {
	p := newParked(t, deadRoutes, "")
	p.queue("data/a", "1", "2", "3")
	p.moveByPayload("1", "refused 1")
	p.moveByPayload("2", "refused 2")
	want := p.br.Stats()
	p = p.restart(deadRoutes)
	st := p.br.Stats()
	if st.DeadLetters != 2 || st.DeadLetterBytes != want.DeadLetterBytes || st.Depth != 1 || st.DeadLettered != 0 {
		t.Errorf("after the restart %+v; want 2 dead letters of %d bytes, 1 queued", st, want.DeadLetterBytes)
	}
	if !strings.Contains(p.log.String(), "dead letters from before") {
		t.Errorf("the restart does not mention the dead letters:\n%s", p.log.String())
	}
	if n, err := p.br.DropDeadLetters([]uint64{1}); n != 1 || err != nil {
		t.Fatalf("drop: %d, %v", n, err)
	}
	p.moveByPayload("3", "refused 3")
	if pls, seqs := p.dead(); !slices.Equal(seqs, []uint64{2, 3}) || !slices.Equal(pls, []string{"2", "3"}) {
		t.Errorf("dead letters %v %v, want 2 and 3", seqs, pls)
	}
}

// TestDeadLetterDrop: dropped dead letters are counted and logged; an
// unknown sequence is an error naming it, and drops nothing.
func TestDeadLetterDrop(t *testing.T) {
	p := newParked(t, deadRoutes, "")
	p.queue("data/a", "1", "2", "3", "4")
	for _, pl := range []string{"1", "2", "3", "4"} {
		p.moveByPayload(pl, "refused")
	}
	n, err := p.br.DropDeadLetters([]uint64{2, 9, 77})
	if n != 0 || !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), "9,77") {
		t.Errorf("drop of unknown ones: %d, %v", n, err)
	}
	if _, seqs := p.dead(); len(seqs) != 4 {
		t.Errorf("a failed drop dropped: %v left", seqs)
	}
	if n, err := p.br.DropDeadLetters([]uint64{3, 2, 3}); n != 2 || err != nil {
		t.Errorf("drop 2 and 3: %d, %v", n, err)
	}
	if _, seqs := p.dead(); !slices.Equal(seqs, []uint64{1, 4}) {
		t.Errorf("after dropping 2 and 3: %v", seqs)
	}
	if !strings.Contains(p.log.String(), "dead letters dropped by a command") {
		t.Errorf("the drop is not logged:\n%s", p.log.String())
	}
	if n, err := p.br.DropDeadLetters(nil); n != 2 || err != nil {
		t.Errorf("drop all: %d, %v", n, err)
	}
	st := p.br.Stats()
	if st.DeadLetters != 0 || st.DeadLetterBytes != 0 || st.Dropped[DropDeadLetter] != 4 {
		t.Errorf("stats after dropping all %+v", st)
	}
	if n, err := p.br.DropDeadLetters(nil); n != 0 || err != nil {
		t.Errorf("drop all of none: %d, %v", n, err)
	}
}

// TestDeadLetterRetryRules: a retry takes the route's current QoS and
// class; a route no longer configured, or a full outbox for an alarm, is
// an error naming the dead letter; a state dead letter whose topic has a
// newer message queued is dropped as superseded.
func TestDeadLetterRetryRules(t *testing.T) {
	p := newParked(t, deadRoutes, "")
	p.queue("data/a", "d1")
	p.queue("alarm/a", "a1")
	p.queue("state/a", "s1")
	for _, pl := range []string{"d1", "a1", "s1"} {
		p.moveByPayload(pl, "refused")
	}
	p.queue("state/a", "s2") // newer than the dead letter
	n, err := p.br.RetryDeadLetters([]uint64{5})
	if n != 0 || !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), "5") {
		t.Errorf("retry of an unknown one: %d, %v", n, err)
	}
	if n, err := p.br.RetryDeadLetters([]uint64{1, 3}); n != 1 || err != nil {
		t.Errorf("retry 1 and 3: %d, %v; want 1 moved, the state one superseded", n, err)
	}
	if got := payloads(p.outbox()); !slices.Equal(got, []string{"s2", "d1"}) {
		t.Errorf("outbox %v, want s2 then the retried d1", got)
	}
	if st := p.br.Stats(); st.Dropped[DropSuperseded] != 1 || st.DeadLetters != 1 {
		t.Errorf("stats %+v", st)
	}
	// The alarm route is gone: its dead letter cannot be retried, and
	// nothing is.
	p = p.restart(`    out:
      - {filter: "data/#", topic: "up/{2}", qos: 2}
`)
	n, err = p.br.RetryDeadLetters(nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "dead letter 2") || !strings.Contains(err.Error(), "out[1]") {
		t.Errorf("retry with a route gone: %d, %v", n, err)
	}
	if _, seqs := p.dead(); !slices.Equal(seqs, []uint64{2}) {
		t.Errorf("a failed retry moved some: %v left", seqs)
	}
	// A route's QoS is its current one.
	p = p.restart(`    out:
      - {filter: "data/#", topic: "up/{2}", qos: 2}
      - {filter: "alarm/#", topic: "alarm/{2}", class: alarm, qos: 0}
`)
	if n, err := p.br.RetryDeadLetters(nil); n != 1 || err != nil {
		t.Fatalf("retry the alarm: %d, %v", n, err)
	}
	out := p.outbox()
	if last := out[len(out)-1]; string(last.Msg.Payload) != "a1" || last.Msg.QoS != 0 || last.Route != 1 {
		t.Errorf("retried alarm %+v, want QoS 0 on route 1", last)
	}
}

// TestDeadLetterRetryFull: an alarm retried into a full outbox stays a
// dead letter, with an error that says so.
func TestDeadLetterRetryFull(t *testing.T) {
	const cfg = "    max_outbox_bytes: 65536\n" + deadRoutes
	p := newParked(t, cfg, "")
	big := strings.Repeat("a", 30000)
	p.queue("alarm/a", "1"+big)
	p.moveByPayload("1"+big, "refused")
	p.queue("alarm/a", "2"+big, "3"+big) // the outbox is full of alarms now
	n, err := p.br.RetryDeadLetters(nil)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "outbox is full") || !strings.Contains(err.Error(), "dead letter 1") {
		t.Errorf("retry into a full outbox: %d, %v", n, err)
	}
	if st := p.br.Stats(); st.DeadLetters != 1 || st.Depth != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestDeadLetterFailedCommit: a move whose batch fails (the disk is
// full) leaves the entry queued and every counter as it was, and works
// once there is room again.
func TestDeadLetterFailedCommit(t *testing.T) {
	dir := testkit.SmallTmpfs(t, "2m")
	p := newParked(t, "    max_outbox_bytes: 1048576\n"+deadRoutes, filepath.Join(dir, "state.db"))
	big := strings.Repeat("z", 300<<10)
	p.queue("data/a", big)
	e := p.outbox()[0]
	before := p.br.Stats()
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	if err := p.br.deadLetter(e, "refused"); err == nil {
		t.Fatal("moved on a full disk")
	}
	st := p.br.Stats()
	if st.Depth != before.Depth || st.Bytes != before.Bytes || st.DeadLetters != 0 || st.DeadLettered != 0 {
		t.Errorf("stats %+v after a failed move, want %+v", st, before)
	}
	if got := payloads(p.outbox()); len(got) != 1 {
		t.Fatalf("outbox after a failed move: %d entries", len(got))
	}
	if err := os.Remove(filler.Name()); err != nil {
		t.Fatal(err)
	}
	if err := p.br.deadLetter(e, "refused"); err != nil {
		t.Fatalf("the move once there is room: %v", err)
	}
	if st := p.br.Stats(); st.Depth != 0 || st.Bytes != 0 || st.DeadLetters != 1 {
		t.Errorf("stats after the move %+v", st)
	}
}
