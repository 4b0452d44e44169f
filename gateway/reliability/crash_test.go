package reliability

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The load each kill cycle puts on the broker.
const (
	// qos1Publishers and window: enough concurrent publishes that a
	// group commit carries several of them, so a kill lands between the
	// routing of a message and the fsync that acknowledges it.
	qos1Publishers = 5
	window         = 4
	// offlineSubscribers stay away for the whole run: everything they get
	// comes from the state file.
	offlineSubscribers = 3
	// liveWindow is the Receive Maximum of the subscriber that stays
	// online between kills, so that messages are in flight to it when the
	// broker dies.
	liveWindow = 8

	// killAfterMin and killAfterSpread place the kill 100–600 ms after the
	// load starts: past connection setup, inside the stream of commits.
	killAfterMin    = 100 * time.Millisecond
	killAfterSpread = 500 * time.Millisecond

	// drainQuiet is how long a subscriber waits for one more message
	// before it counts its queue as empty; drainGrace is how long it
	// waits once more when acknowledged messages are still missing, so
	// that a pause on a loaded machine is not taken for a loss.
	drainQuiet = time.Second
	drainGrace = 5 * time.Second

	defaultKills = 10
)

// TestCrash builds the gateway once and runs the QoS 1 and QoS 2 crash
// cycles against it.
func TestCrash(t *testing.T) {
	kills := defaultKills
	if v := os.Getenv("FIELDGATE_CRASH_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FIELDGATE_CRASH_KILLS=%q: want a number of kill cycles, 1 or more", v)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FIELDGATE_CRASH_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FIELDGATE_CRASH_SEED=%q: want the unsigned number an earlier run logged", v)
		}
		seed = n
	}
	t.Logf("%d kill cycles; FIELDGATE_CRASH_SEED=%d replays these kill timings", kills, seed)
	bin := buildGateway(t, t.TempDir())

	// QoS 1: five publishers that start clean on every connection, three
	// offline persistent subscribers and one that stays online. Nothing
	// acknowledged may be lost; duplicates are allowed at QoS 1, but each
	// kill can bring back only the messages in flight to the online
	// subscriber and those it acknowledged whose removal was not yet on
	// disk, which the publishers' windows bound. The offline subscribers
	// should see none.
	t.Run("QoS1", func(t *testing.T) {
		var pubs []*publisher
		for i := range qos1Publishers {
			id := fmt.Sprintf("q1-pub-%d", i)
			pubs = append(pubs, &publisher{id: id, topic: "crash/" + id, qos: 1})
		}
		maxDup := kills * qos1Publishers * window * (offlineSubscribers + 1)
		crash(t, bin, kills, rand.New(rand.NewPCG(seed, 1)), "crash/#", pubs, maxDup)
	})
	// QoS 2: one publisher that keeps its session across the kills and
	// resends what was not completed as the protocol asks, three offline
	// subscribers and one online, all at QoS 2. Nothing acknowledged may
	// be lost, and nothing may arrive twice.
	t.Run("QoS2", func(t *testing.T) {
		pubs := []*publisher{{id: "q2-pub", topic: "crash2/q2-pub", qos: 2, persistent: true}}
		crash(t, bin, kills, rand.New(rand.NewPCG(seed, 2)), "crash2/#", pubs, 0)
	})
}

// crash runs one scenario: a gateway, persistent subscribers to filter at
// the publishers' QoS, kill cycles under the publishers' load, then a
// last start in which the subscribers take everything queued for them and
// are checked against what the broker acknowledged.
func crash(t *testing.T, bin string, kills int, rng *rand.Rand, filter string, pubs []*publisher, maxDup int) {
	began := time.Now()
	qos := pubs[0].qos
	g := newGateway(t, bin)
	g.start()
	l := newLedger()
	subs := subscribers(t, g.addr, fmt.Sprintf("q%d", qos), filter, qos)
	live := subs[len(subs)-1]

	var load []func() error
	for _, p := range pubs {
		load = append(load, func() error { return p.run(g.addr, l) })
	}
	load = append(load, func() error { return live.online(g.addr) })
	if !cycles(t, g, kills, rng, load) {
		return
	}

	g.start()
	for _, p := range pubs {
		if p.persistent {
			// It finishes what it had in flight, as a device does when
			// its broker comes back, so that the ledger is final.
			if err := p.finish(g.addr, l); err != nil {
				t.Errorf("%s completing its flights: %v", p.id, err)
			}
		}
		for _, msg := range p.problems {
			t.Errorf("%s: %s", p.id, msg)
		}
	}
	drain(t, g.addr, subs, l)
	g.stop()
	g.checkState()

	verify(t, l, subs, maxDup)
	t.Logf("QoS %d: %d kills in %s", qos, kills, time.Since(began).Round(time.Millisecond))
}

// ledger is what the publishers sent and what the broker acknowledged,
// over all the cycles of a scenario.
type ledger struct {
	mu      sync.Mutex
	sent    map[string]bool
	acked   map[string]bool
	refused map[byte]int // acknowledgements with a reason code other than 0, by code
}

func newLedger() *ledger {
	return &ledger{sent: make(map[string]bool), acked: make(map[string]bool), refused: make(map[byte]int)}
}

func (l *ledger) send(payload string) {
	l.mu.Lock()
	l.sent[payload] = true
	l.mu.Unlock()
}

// ack records a PUBACK or PUBREC: reason code 0 is the broker's promise
// that the message is stored for every subscriber.
func (l *ledger) ack(payload string, code byte) {
	l.mu.Lock()
	if code == 0 {
		l.acked[payload] = true
	} else {
		l.refused[code]++
	}
	l.mu.Unlock()
}

// publisher publishes messages with unique payloads (its id and a
// sequence number) to one topic, as fast as acknowledgements come, with
// at most window unacknowledged. A persistent one keeps its session and
// the state of its unfinished exchanges across connections, and resumes
// them as the protocol asks; it is never killed, only its broker is.
// Otherwise every connection starts clean, and what was not acknowledged
// when the broker died is simply not in the ledger.
type publisher struct {
	id, topic  string
	qos        byte
	persistent bool

	seq      int
	started  bool         // has had a session
	flights  []*outFlight // in the order first sent
	nextPID  uint16
	problems []string
}

// outFlight is a QoS 1/2 PUBLISH sent and not completed.
type outFlight struct {
	pid     uint16
	payload string
	rec     bool // PUBREC came: PUBREL is what to resend
}

// run connects, resumes the session, resends what was not completed and
// publishes new messages until the connection fails.
func (p *publisher) run(addr string, l *ledger) error {
	return p.connection(addr, l, true)
}

// finish resumes the session and completes the flights left from the
// last connection, publishing nothing new.
func (p *publisher) finish(addr string, l *ledger) error {
	return p.connection(addr, l, false)
}

func (p *publisher) connection(addr string, l *ledger, publishNew bool) error {
	var expiry uint32
	if p.persistent {
		expiry = sessionExpiry
	} else {
		p.flights = nil
	}
	c, present, err := dial(addr, p.id, !p.persistent || !p.started, expiry, 0)
	if err != nil {
		return err
	}
	if p.started && p.persistent && !present {
		// The broker forgot the session. That is allowed only if it had
		// not yet stored anything of it: an acknowledged PUBLISH was
		// stored with the session's identifiers, the session before it.
		for _, f := range p.flights {
			if f.rec {
				p.problems = append(p.problems, fmt.Sprintf("session gone at reconnect although %q had its PUBREC", f.payload))
			}
		}
		// With no session the client discards its state [MQTT-4.4.0-1]:
		// what was never acknowledged is not in the ledger.
		p.flights = nil
	}
	p.started = true

	var mu sync.Mutex
	free := make(chan struct{}, window)
	for range window - len(p.flights) {
		free <- struct{}{}
	}
	// done gets one token a completed flight; finish counts them. The
	// tokens never outnumber free's, so neither send blocks.
	done := make(chan struct{}, window)
	readErr := make(chan error, 1)
	remove := func(i int) {
		p.flights = slices.Delete(p.flights, i, i+1)
		free <- struct{}{}
		done <- struct{}{}
	}
	go func() {
		for {
			pk, err := c.read(ioTimeout)
			if err != nil {
				readErr <- err
				return
			}
			t := pk.FixedHeader.Type
			want := t == packets.Puback
			if p.qos == 2 {
				want = t == packets.Pubrec || t == packets.Pubcomp
			}
			if !want {
				readErr <- fmt.Errorf("%s: %s from the broker, which a QoS %d publisher does not expect", p.id, packetName(pk), p.qos)
				return
			}
			mu.Lock()
			i := slices.IndexFunc(p.flights, func(f *outFlight) bool { return f.pid == pk.PacketID })
			if i < 0 {
				mu.Unlock()
				readErr <- fmt.Errorf("%s: %s for packet id %d, which is not in flight", p.id, packetName(pk), pk.PacketID)
				return
			}
			f := p.flights[i]
			switch {
			case t == packets.Puback, t == packets.Pubrec && pk.ReasonCode >= 0x80:
				// Done; a refused PUBREC ends the exchange too [MQTT-4.3.3-4].
				l.ack(f.payload, pk.ReasonCode)
				remove(i)
			case t == packets.Pubrec:
				if !f.rec {
					f.rec = true
					l.ack(f.payload, pk.ReasonCode)
				}
			case !f.rec:
				mu.Unlock()
				readErr <- fmt.Errorf("%s: PUBCOMP for packet id %d before its PUBREC", p.id, pk.PacketID)
				return
			default:
				// 0x92 (identifier not found) is a PUBREL the broker had
				// already completed before a crash cut off its PUBCOMP.
				remove(i)
			}
			mu.Unlock()
			if t == packets.Pubrec && pk.ReasonCode < 0x80 {
				if err := c.ack(packets.Pubrel, pk.PacketID); err != nil {
					readErr <- err
					return
				}
			}
		}
	}()
	defer func() {
		c.close()
		<-readErr // the reader has seen the close, or returned earlier with its error put back
	}()

	// Resend in the original order, PUBLISH with DUP or PUBREL
	// [MQTT-4.4.0-1] [MQTT-4.3.3-5]; the reader may already be answering.
	mu.Lock()
	resend := slices.Clone(p.flights)
	mu.Unlock()
	for _, f := range resend {
		if f.rec {
			err = c.ack(packets.Pubrel, f.pid)
		} else {
			err = c.publish(p.topic, f.payload, p.qos, f.pid, true)
		}
		if err != nil {
			return err
		}
	}

	if !publishNew {
		for range resend {
			select {
			case <-done:
			case err := <-readErr:
				readErr <- err
				return err
			}
		}
		c.disconnect()
		return nil
	}
	for {
		select {
		case <-free:
		case err := <-readErr:
			readErr <- err
			return err
		}
		select {
		case <-done:
		default:
		}
		mu.Lock()
		for {
			p.nextPID++
			if p.nextPID != 0 && !slices.ContainsFunc(p.flights, func(f *outFlight) bool { return f.pid == p.nextPID }) {
				break
			}
		}
		p.seq++
		f := &outFlight{pid: p.nextPID, payload: fmt.Sprintf("%s/%d", p.id, p.seq)}
		p.flights = append(p.flights, f)
		mu.Unlock()
		l.send(f.payload)
		if err := c.publish(p.topic, f.payload, p.qos, f.pid, false); err != nil {
			return err
		}
	}
}

// receiver is a persistent subscriber: its session lives in the broker,
// and its own QoS 2 state (identifiers received and not yet released) in
// the test, across its connections.
type receiver struct {
	id       string
	qos      byte
	got      map[string]int    // payload → times handed to the application
	rel      map[uint16]string // QoS 2: packet id → payload received, PUBREL not yet
	problems []string
}

// subscribers creates the persistent sessions: three that stay offline
// and, last, one that comes online in every cycle.
func subscribers(t *testing.T, addr, prefix, filter string, qos byte) []*receiver {
	t.Helper()
	var rs []*receiver
	for i := range offlineSubscribers + 1 {
		id := fmt.Sprintf("%s-sub-%d", prefix, i)
		if i == offlineSubscribers {
			id = prefix + "-sub-live"
		}
		r := &receiver{id: id, qos: qos, got: make(map[string]int), rel: make(map[uint16]string)}
		c, _, err := dial(addr, id, true, sessionExpiry, 0)
		if err != nil {
			t.Fatalf("subscriber %s: %v", id, err)
		}
		if err := c.subscribe(filter, qos); err != nil {
			t.Fatalf("subscriber %s: %v", id, err)
		}
		c.disconnect()
		rs = append(rs, r)
	}
	return rs
}

// connect resumes the receiver's session, which must still be there: its
// subscription was acknowledged, so it is on disk.
func (r *receiver) connect(addr string, receiveMax uint16) (*client, error) {
	c, present, err := dial(addr, r.id, false, sessionExpiry, receiveMax)
	if err != nil {
		return nil, err
	}
	if !present {
		c.close()
		return nil, fmt.Errorf("%s: session not present after a restart: %w", r.id, errSessionLost)
	}
	return c, nil
}

var errSessionLost = errors.New("persistent session lost")

// online receives until the connection ends, as the broker is killed.
func (r *receiver) online(addr string) error {
	c, err := r.connect(addr, liveWindow)
	if err != nil {
		return err
	}
	defer c.close()
	// The kill ends the connection long before the deadline.
	err = r.receive(c, ioTimeout, time.Now().Add(time.Minute))
	if err == nil {
		err = fmt.Errorf("%s: nothing received for %s while publishers ran", r.id, ioTimeout)
	}
	return err
}

// receive takes messages from c and acknowledges them until nothing
// arrives for quiet, when it returns nil, or the connection fails, or
// messages still come at the deadline.
func (r *receiver) receive(c *client, quiet time.Duration, deadline time.Time) error {
	for {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: messages still coming at the deadline: is the broker sending the same ones again and again?", r.id)
		}
		pk, err := c.read(quiet)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return err
		}
		switch pk.FixedHeader.Type {
		case packets.Publish:
			err = r.onPublish(c, pk)
		case packets.Pubrel:
			delete(r.rel, pk.PacketID)
			err = c.ack(packets.Pubcomp, pk.PacketID)
		case packets.Disconnect:
			return fmt.Errorf("%s: DISCONNECT 0x%02x %q from the broker", r.id, pk.ReasonCode, pk.Properties.ReasonString)
		default:
			r.problem("%s from the broker, unexpected by a subscriber", packetName(pk))
		}
		if err != nil {
			return err
		}
	}
}

func (r *receiver) onPublish(c *client, pk *packets.Packet) error {
	payload := string(pk.Payload)
	if q := pk.FixedHeader.Qos; q != r.qos {
		r.problem("%q came at QoS %d; the subscription and the publisher are at QoS %d", payload, q, r.qos)
	}
	if r.qos == 1 {
		r.got[payload]++
		return c.ack(packets.Puback, pk.PacketID)
	}
	// QoS 2, delivered when the PUBLISH first comes; a PUBLISH with an
	// identifier not yet released is the same message again
	// [MQTT-4.3.3-10].
	if was, held := r.rel[pk.PacketID]; held {
		if was != payload {
			r.problem("packet id %d reused for %q while %q awaited its PUBREL", pk.PacketID, payload, was)
		}
		if !pk.FixedHeader.Dup {
			r.problem("%q sent again under packet id %d without DUP", payload, pk.PacketID)
		}
	} else {
		if r.got[payload] > 0 {
			// Its exchange was complete (PUBREL came): the broker lost
			// that and sent it as a new message.
			r.problem("%q delivered again, under packet id %d with DUP %t, after its PUBREL", payload, pk.PacketID, pk.FixedHeader.Dup)
		}
		r.rel[pk.PacketID] = payload
		r.got[payload]++
	}
	return c.ack(packets.Pubrec, pk.PacketID)
}

// missing counts the acknowledged messages r has not received.
func (r *receiver) missing(l *ledger) int {
	n := 0
	for p := range l.acked {
		if r.got[p] == 0 {
			n++
		}
	}
	return n
}

func (r *receiver) problem(format string, args ...any) {
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// drain connects every receiver and takes everything its session holds.
// The publishers have stopped: l no longer changes.
func drain(t *testing.T, addr string, rs []*receiver, l *ledger) {
	t.Helper()
	began := time.Now()
	// Far more than a healthy drain takes (it grows with the queue): only
	// a broker that never stops sending reaches it.
	deadline := began.Add(time.Minute + time.Duration(len(l.sent))*2*time.Millisecond)
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() {
			c, err := r.connect(addr, 0)
			if err != nil {
				errs[i] = err
				return
			}
			err = r.receive(c, drainQuiet, deadline)
			if err == nil && r.missing(l) > 0 {
				err = r.receive(c, drainGrace, deadline)
			}
			errs[i] = err
			c.disconnect()
			for pid, p := range r.rel {
				// The broker has it as in flight with its PUBREC, and
				// owes the PUBREL [MQTT-4.3.3-4].
				r.problem("no PUBREL for %q (packet id %d) after its PUBREC", p, pid)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("draining: %v", err)
		}
	}
	t.Logf("drained %d subscribers in %s", len(rs), time.Since(began).Round(time.Millisecond))
}

// cycles runs kill cycles on g, which is running: each runs every load
// function in its own goroutine (a client that works until its connection
// fails), kills the gateway 100–600 ms later and waits for the clients to
// stop. Any client error but the connection loss the kill causes fails
// the test; cycles reports whether the test may go on.
func cycles(t *testing.T, g *gateway, kills int, rng *rand.Rand, load []func() error) bool {
	t.Helper()
	for cycle := range kills {
		if cycle > 0 {
			g.start()
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(load))
		for _, fn := range load {
			wg.Go(func() { errs <- fn() })
		}
		time.Sleep(killAfterMin + time.Duration(rng.Int64N(int64(killAfterSpread))))
		g.kill()
		done := make(chan struct{})
		go func() {
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(2 * ioTimeout):
			// Every client read is bounded by ioTimeout: one still
			// running is stuck on a broker that is not gone.
			t.Fatalf("cycle %d: clients still running %s after the kill", cycle, 2*ioTimeout)
		}
		close(errs)
		for err := range errs {
			if err != nil && !connLost(err) {
				t.Errorf("cycle %d: %v", cycle, err)
			}
		}
		if t.Failed() {
			return false
		}
	}
	return true
}

// connLost reports whether err is the end of a connection the kill cut,
// or a connection attempt that came after it.
func connLost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// verify checks every receiver against the ledger: each acknowledged
// payload delivered (lost = 0), nothing delivered that was never sent, and
// at most maxDup duplicates over all receivers.
func verify(t *testing.T, l *ledger, rs []*receiver, maxDup int) {
	t.Helper()
	acked := make([]string, 0, len(l.acked))
	for p := range l.acked {
		acked = append(acked, p)
	}
	slices.Sort(acked)
	t.Logf("published %d, acknowledged %d, refused %v", len(l.sent), len(acked), l.refused)
	if len(acked) == 0 {
		t.Errorf("no message was acknowledged: the load never ran")
	}
	dups := 0
	for _, r := range rs {
		var lost, unknown []string
		for _, p := range acked {
			if r.got[p] == 0 {
				lost = append(lost, p)
			}
		}
		delivered, rdups := 0, 0
		for p, n := range r.got {
			delivered += n
			rdups += n - 1
			if !l.sent[p] {
				unknown = append(unknown, p)
			}
		}
		dups += rdups
		t.Logf("%s: delivered %d, lost %d, duplicates %d", r.id, delivered, len(lost), rdups)
		if len(lost) > 0 {
			t.Errorf("%s: %d acknowledged messages never delivered, such as %q", r.id, len(lost), lost[:min(len(lost), 10)])
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			t.Errorf("%s: %d messages delivered that no publisher sent, such as %q", r.id, len(unknown), unknown[:min(len(unknown), 10)])
		}
		for _, p := range r.problems {
			t.Errorf("%s: %s", r.id, p)
		}
	}
	if dups > maxDup {
		t.Errorf("%d duplicate deliveries, more than the %d allowed", dups, maxDup)
	}
}
