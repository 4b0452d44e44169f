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

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
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

	// crashShortKills is the kill cycles of each scenario under make test:
	// TestCrash's two runs and TestCrashBridge's outage and replay phases
	// together take about a minute under -race on a 2-core machine, which
	// leaves room for the rest of the suite. crashSoakKills is what make
	// soak asks for.
	crashShortKills = 10
	crashSoakKills  = 100

	// crashBridgeName is the bridge of every crash test's gateway, as its
	// metrics label it.
	crashBridgeName = "cloud"
)

// Deadlines of the crash tests, on the suite's time scale.
var (
	// drainGrace: see drainQuiet. Only a run with messages missing waits
	// it, so it can be generous.
	drainGrace = testkit.Scale(5 * time.Second)
	// crashOutboxStall is how long the last start's outbox may go without
	// shrinking before the wait for it to empty gives up: longer than the
	// ten seconds the bridge waits at a gap in the outbox's sequence
	// numbers, whatever the backlog (a soak run's outage leaves a large
	// one).
	crashOutboxStall = testkit.Scale(30 * time.Second)
)

// crashParams returns the number of kill cycles and the seed of their
// timings: FIELDGATE_CRASH_KILLS and FIELDGATE_CRASH_SEED when set.
func crashParams(t *testing.T) (kills int, seed uint64) {
	t.Helper()
	kills = relrecord.Pick(crashShortKills, crashSoakKills)
	if v := os.Getenv("FIELDGATE_CRASH_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FIELDGATE_CRASH_KILLS=%q: want a number of kill cycles, 1 or more", v)
		}
		kills = n
	}
	seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("FIELDGATE_CRASH_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FIELDGATE_CRASH_SEED=%q: want the unsigned number an earlier run logged", v)
		}
		seed = n
	}
	t.Logf("%d kill cycles; FIELDGATE_CRASH_SEED=%d replays these kill timings", kills, seed)
	return kills, seed
}

// crashBridgeYAML is the bridge section of a crash test's gateway: one
// out-route from filter to up/{topic} on the upstream at addr, at qos. It
// reconnects fast, so that each start's bridge is up long before the
// kill, and sends unpaced. The outbox's budget is far above what a run
// queues, and the route's class is alarm, which is never dropped: every
// message the gateway acknowledged has to reach the upstream.
func crashBridgeYAML(addr, filter string, qos byte) string {
	return fmt.Sprintf(`gateway: {name: crash}
bridges:
  - name: %s
    address: %q
    reconnect_min: 100ms
    reconnect_max: 300ms
    ack_timeout: 5s
    rate: 0
    max_outbox_bytes: 1073741824
    out:
      - {filter: %q, topic: "up/{topic}", qos: %d, class: alarm}
`, crashBridgeName, addr, filter, qos)
}

// crashBridgeMetric reads one of the bridge's samples from g's /metrics.
// The ops endpoint opens a moment after the MQTT listener that g.start
// waits for, so it waits for that first.
func crashBridgeMetric(g *gateway, name string) float64 {
	g.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		c, err := net.DialTimeout("tcp", g.opsAddr, ioTimeout)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("the ops endpoint %s not listening %s after the start: %v", g.opsAddr, readyTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return g.metric(fmt.Sprintf("%s{bridge=%q}", name, crashBridgeName))
}

// crashCloud creates the cloud application's persistent session on the
// upstream at addr, subscribed to everything the bridge sends at qos, and
// leaves it offline: the upstream queues what the bridge delivers until
// the application connects. (Not Clean Start: mosquitto does not save
// such a session in its persistence file, and TestCrashBridge restarts
// it.)
func crashCloud(t *testing.T, rec *relrecord.Rec, addr, id string, qos byte) *receiver {
	t.Helper()
	c, _, err := dial(addr, id, false, sessionExpiry, 0)
	if err == nil {
		err = c.subscribe("up/#", qos)
		c.disconnect()
	}
	if err != nil {
		crashFatal(t, rec, "cloud subscriber %s: %v", id, err)
	}
	return &receiver{id: id, qos: qos, got: make(map[string]int), rel: make(map[uint16]string)}
}

// crashAwaitOutbox waits until the running gateway's bridge has had every
// outbox entry acknowledged upstream, so that what the upstream holds for
// the cloud application is final.
func crashAwaitOutbox(t *testing.T, rec *relrecord.Rec, g *gateway) {
	t.Helper()
	began, moved := time.Now(), time.Now()
	least := -1.0
	for {
		n := crashBridgeMetric(g, "fieldgate_bridge_outbox_messages")
		if n == 0 {
			t.Logf("outbox empty %s after the wait for it began", time.Since(began).Round(time.Millisecond))
			return
		}
		if least < 0 || n < least {
			least, moved = n, time.Now()
		}
		if time.Since(moved) > crashOutboxStall {
			crashFail(t, rec, "the bridge's outbox has held %.0f messages for %s: the upstream is not taking them", least, crashOutboxStall)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crashCloudFollow keeps the cloud application r connected to the
// upstream at addr, taking what it is sent, until the returned function
// is called: that waits for g's bridge to empty its outbox, ends r's
// connection and drains what the upstream still holds for r. The ledger
// must be final by then.
//
// Online, r keeps the upstream's queue for it short: mosquitto takes
// messages for an offline subscriber at a few hundred a second, which
// would hide the bridge's own speed and make a backlog slow to drain.
func crashCloudFollow(t *testing.T, rec *relrecord.Rec, addr string, r *receiver) (finish func(g *gateway, l *ledger)) {
	t.Helper()
	c, err := r.connect(addr, 0)
	if err != nil {
		crashFatal(t, rec, "cloud subscriber: %v", err)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			// A short quiet only to look at stop again: the drain
			// afterwards is what waits long enough for a loss to be one.
			err := r.receive(c, 100*time.Millisecond, time.Now().Add(time.Hour))
			select {
			case <-stop:
			default:
				if err == nil {
					continue
				}
			}
			c.disconnect()
			done <- err
			return
		}
	}()
	return func(g *gateway, l *ledger) {
		t.Helper()
		crashAwaitOutbox(t, rec, g)
		close(stop)
		if err := <-done; err != nil {
			crashFail(t, rec, "cloud subscriber %s: %v", r.id, err)
		}
		drain(t, rec, addr, []*receiver{r}, l)
	}
}

// crashFail fails the test and gives the reason to its record.
func crashFail(t *testing.T, rec *relrecord.Rec, format string, args ...any) {
	t.Helper()
	rec.Fail(format, args...)
	t.Errorf(format, args...)
}

// crashFatal is crashFail that stops the test.
func crashFatal(t *testing.T, rec *relrecord.Rec, format string, args ...any) {
	t.Helper()
	rec.Fail(format, args...)
	t.Fatalf(format, args...)
}

// TestCrash builds the gateway once and runs the QoS 1 and QoS 2 crash
// cycles against it. Each run has an active bridge: an out-route carries
// the publishers' topics, at the publishers' QoS, to a mosquitto on which
// a persistent cloud application is subscribed, and every acknowledged
// message must reach it as well as every local subscriber.
func TestCrash(t *testing.T) {
	kills, seed := crashParams(t)
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
		crash(t, bin, kills, seed, 1, "crash/#", pubs, maxDup)
	})
	// QoS 2: one publisher that keeps its session across the kills and
	// resends what was not completed as the protocol asks, three offline
	// subscribers and one online, all at QoS 2. Nothing acknowledged may
	// be lost, and nothing may arrive twice at a local subscriber.
	t.Run("QoS2", func(t *testing.T) {
		pubs := []*publisher{{id: "q2-pub", topic: "crash2/q2-pub", qos: 2, persistent: true}}
		crash(t, bin, kills, seed, 2, "crash2/#", pubs, 0)
	})
}

// crash runs one scenario: a gateway bridged to its own mosquitto,
// persistent subscribers to filter at the publishers' QoS there and
// locally, kill cycles under the publishers' load, then a last start in
// which the local subscribers take everything queued for them, the
// bridge empties its outbox, and the cloud application takes what the
// upstream queued; all are checked against what the broker acknowledged.
// stream picks the scenario's own sequence of kill timings from seed.
func crash(t *testing.T, bin string, kills int, seed, stream uint64, filter string, pubs []*publisher, maxDup int) {
	began := time.Now()
	qos := pubs[0].qos
	rec := relrecord.Begin(t, "crash", fmt.Sprintf("qos%d+bridge", qos))
	rec.Add("kills", "%d", kills)
	rec.Add("seed", "%d (FIELDGATE_CRASH_SEED)", seed)
	rec.Add("load", "%d QoS %d publishers; %d offline and 1 live persistent local subscribers; 1 live persistent subscriber upstream",
		len(pubs), qos, offlineSubscribers)

	up := mosquitto.Start(t, mosquitto.Cloud())
	cloud := crashCloud(t, rec, up.Addr(), fmt.Sprintf("q%d-cloud", qos), qos)
	// At QoS 1 the cloud application counts duplicates instead of failing
	// on them: the bridge deletes an entry acknowledged upstream with a
	// lazy commit, and a kill before it lands sends the entry again. At
	// QoS 2 it fails on them: the bridge records each packet identifier
	// and stage before the PUBLISH or PUBREL goes out, and resumes its
	// upstream session with them after a start, so the upstream sees a
	// resend as the exchange it already had.
	cloud.dupAllowed = qos < 2
	// The cloud application stays online, as one usually does: the
	// bridge then carries the load as fast as the upstream takes it, and
	// each kill cuts off a full window of it.
	cloudFinish := crashCloudFollow(t, rec, up.Addr(), cloud)

	g := newGatewayWith(t, bin, crashBridgeYAML(up.Addr(), filter, qos))
	g.start()
	l := newLedger()
	subs := subscribers(t, g.addr, fmt.Sprintf("q%d", qos), filter, qos)
	live := subs[len(subs)-1]

	var load []func() error
	for _, p := range pubs {
		load = append(load, func() error { return p.run(g.addr, l) })
	}
	load = append(load, func() error { return live.online(g.addr) })
	// The bridge must be active when the kill comes: connected, and
	// carrying the load upstream.
	connected, upAcked := 0, 0.0
	atKill := func() {
		if crashBridgeMetric(g, "fieldgate_bridge_up") == 1 {
			connected++
		}
		upAcked += crashBridgeMetric(g, "fieldgate_bridge_messages_acked_total")
	}
	rng := rand.New(rand.NewPCG(seed, stream))
	if !cycles(t, rec, g, kills, rng, load, atKill) {
		return
	}
	rec.Add("bridge connected at the kill", "%d of %d kills", connected, kills)
	rec.Add("upstream acknowledgements before the kills", "%.0f (resends included)", upAcked)
	// Half the kills leaves room for a start whose link is slow to come
	// up on a loaded machine, and none for a bridge that is not there.
	if connected*2 < kills || upAcked == 0 {
		crashFail(t, rec, "the bridge was connected at %d of %d kills and had %.0f messages acknowledged upstream: it was not active under the load", connected, kills, upAcked)
	}

	g.start()
	rec.Add("outbox at the last start", "%.0f messages", crashBridgeMetric(g, "fieldgate_bridge_outbox_messages"))
	for _, p := range pubs {
		if p.persistent {
			// It finishes what it had in flight, as a device does when
			// its broker comes back, so that the ledger is final.
			if err := p.finish(g.addr, l); err != nil {
				crashFail(t, rec, "%s completing its flights: %v", p.id, err)
			}
		}
		for _, msg := range p.problems {
			crashFail(t, rec, "%s: %s", p.id, msg)
		}
	}
	drain(t, rec, g.addr, subs, l)
	cloudFinish(g, l)
	g.stop()
	g.checkState()

	crashLedger(t, rec, l)
	local := verify(t, rec, "local", l, subs, maxDup)
	upDups := crashUpstreamDups(l)
	if qos == 2 {
		upDups = 0
	}
	upstream := verify(t, rec, "upstream", l, []*receiver{cloud}, upDups)
	rec.Add("lost (local)", "%d", local.lost)
	rec.Add("lost (upstream)", "%d", upstream.lost)
	rec.Add(fmt.Sprintf("QoS %d duplicates (local)", qos), "%d", local.dups)
	rec.Add(fmt.Sprintf("QoS %d duplicates (upstream)", qos), "%d", upstream.dups)
	t.Logf("QoS %d: %d kills in %s", qos, kills, time.Since(began).Round(time.Millisecond))
}

// crashUpstreamDups bounds the duplicates the cloud application may see.
// A kill sends again what was in flight upstream and what was
// acknowledged without its delete on disk yet: a small part of a run. As
// many duplicates as acknowledged messages would be a bridge that
// replays what it had delivered.
func crashUpstreamDups(l *ledger) int { return len(l.acked) }

// crashLedger records what the publishers sent and the broker
// acknowledged; a run in which nothing was acknowledged checked nothing.
func crashLedger(t *testing.T, rec *relrecord.Rec, l *ledger) {
	t.Helper()
	rec.Add("published", "%d", len(l.sent))
	rec.Add("acknowledged", "%d", len(l.acked))
	if len(l.refused) > 0 {
		rec.Add("refused", "%v (by reason code)", l.refused)
	}
	if len(l.acked) == 0 {
		crashFail(t, rec, "no message was acknowledged: the load never ran")
	}
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
	// dupAllowed counts a QoS 2 message delivered again after its
	// exchange completed as a duplicate rather than a broken promise:
	// for the cloud application, whose broker takes each resend of the
	// bridge's as new.
	dupAllowed bool
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
	err = r.receive(c, ioTimeout, time.Now().Add(testkit.Scale(time.Minute)))
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
		if r.got[payload] > 0 && !r.dupAllowed {
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
func drain(t *testing.T, rec *relrecord.Rec, addr string, rs []*receiver, l *ledger) {
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
			crashFail(t, rec, "draining: %v", err)
		}
	}
	t.Logf("drained %d subscribers in %s", len(rs), time.Since(began).Round(time.Millisecond))
}

// cycles runs kill cycles on g, which is running: each runs every load
// function in its own goroutine (a client that works until its connection
// fails), kills the gateway 100–600 ms later and waits for the clients to
// stop. atKill, when not nil, looks at the gateway just before each kill.
// Any client error but the connection loss the kill causes fails the
// test; cycles reports whether the test may go on.
func cycles(t *testing.T, rec *relrecord.Rec, g *gateway, kills int, rng *rand.Rand, load []func() error, atKill func()) bool {
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
		if atKill != nil {
			atKill()
		}
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
			crashFatal(t, rec, "cycle %d: clients still running %s after the kill", cycle, 2*ioTimeout)
		}
		close(errs)
		for err := range errs {
			if err != nil && !connLost(err) {
				crashFail(t, rec, "cycle %d: %v", cycle, err)
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

// crashTally is what verify found over a set of receivers.
type crashTally struct {
	lost int // acknowledged messages a receiver never got, summed over the receivers
	dups int // deliveries beyond the first, summed over the receivers
}

// verify checks every receiver against the ledger: each acknowledged
// payload delivered (lost = 0), nothing delivered that was never sent, and
// at most maxDup duplicates over all receivers. where names the receivers
// (local, upstream) in the failures.
func verify(t *testing.T, rec *relrecord.Rec, where string, l *ledger, rs []*receiver, maxDup int) crashTally {
	t.Helper()
	acked := make([]string, 0, len(l.acked))
	for p := range l.acked {
		acked = append(acked, p)
	}
	slices.Sort(acked)
	var sum crashTally
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
		sum.lost += len(lost)
		sum.dups += rdups
		t.Logf("%s (%s): delivered %d, lost %d, duplicates %d", r.id, where, delivered, len(lost), rdups)
		if len(lost) > 0 {
			crashFail(t, rec, "%s (%s): %d acknowledged messages never delivered, such as %q", r.id, where, len(lost), lost[:min(len(lost), 10)])
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			crashFail(t, rec, "%s (%s): %d messages delivered that no publisher sent, such as %q", r.id, where, len(unknown), unknown[:min(len(unknown), 10)])
		}
		for _, p := range r.problems {
			crashFail(t, rec, "%s (%s): %s", r.id, where, p)
		}
	}
	if sum.dups > maxDup {
		crashFail(t, rec, "%d duplicate deliveries (%s), more than the %d allowed", sum.dups, where, maxDup)
	}
	return sum
}
