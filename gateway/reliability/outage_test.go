package reliability

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The bridge-outage cases. A publisher offers numbered QoS 1 messages to
// the gateway on two out-routes at a steady outageRate while the bridge's
// link to a real upstream (mosquitto) fails, in one way in each case; a
// cloud application subscribed on the upstream takes what arrives. Each
// message carries its route and its number on that route, 1, 2, 3… in the
// order published; one connection publishes them all, so that is also the
// order in which the gateway acknowledged and queued them.
//
// What counts, per route:
//
//   - a delivery is a PUBLISH the cloud subscriber receives;
//   - lost: a number the gateway acknowledged (PUBACK 0x00) that no
//     delivery carries once everything has drained. It must be 0;
//   - a duplicate: a delivery of a number delivered before, wherever it
//     comes in the stream. QoS 1 allows them: after a reconnect the bridge
//     resends what it had in flight (under the same packet identifiers
//     when the upstream kept its session, as new messages when it did
//     not), and the upstream resends what it had in flight to the
//     subscriber. They are counted and reported, not failed;
//   - out of order: a first delivery of a number lower than one already
//     delivered on the route. A redelivery is never an order violation;
//     a message that first arrives after a later one of its route is, even
//     if both arrive in the end. It must be 0.
//
// The drain time after reconnect is measured from the end of a fault (the
// upstream started again, or the proxy thawed or cut) until the cloud has
// every message published before that moment.
const (
	// outageRate is the load offered to the gateway, in messages a
	// second over both routes; outageWindow caps the publisher's
	// unacknowledged messages, far above what a gateway that keeps up
	// needs at this rate.
	outageRate   = 200
	outageWindow = 64

	// The bridge's link settings: short enough that a silent link is
	// noticed within seconds, long enough that a loaded 2-core machine
	// does not take a slow PUBACK for a dead link. A reconnect waits at
	// most outageReconnectMax, so a restarted upstream is found soon.
	outageKeepAlive    = time.Second
	outageAckTimeout   = 2 * time.Second
	outageReconnectMax = time.Second
	// outageReplayRate is the bridge's rate: ten times the offered load,
	// so a backlog drains at about 1,800 messages a second net, and paced
	// so that a restart can land in the middle of a replay.
	outageReplayRate = 2000

	// outageWarm is the steady traffic through a working link before the
	// first fault, and outageSettle after each fault's backlog has
	// drained: the next fault finds the link as it runs normally.
	outageWarm   = time.Second
	outageSettle = 1500 * time.Millisecond
)

// Deadlines of the outage tests, on the suite's time scale. Only a run
// with messages missing waits them out.
var (
	// outageQuiet: in the final drain, with the publisher stopped,
	// nothing arriving for this long while acknowledged messages are
	// still missing means they are not coming.
	outageQuiet = testkit.Scale(5 * time.Second)
	// outageDrainSlack is added to three times the time a backlog should
	// take to drain at outageReplayRate: the wait for it fails past that.
	outageDrainSlack = testkit.Scale(20 * time.Second)
)

// outageRoutes are the routes the publisher feeds, one out-route each.
var outageRoutes = []struct{ name, local, remote string }{
	{"a", "outage/a", "up/a"},
	{"b", "outage/b", "up/b"},
}

// outageBridge is the gateway's bridges: section for an upstream at addr.
// Route b is an alarm route, which is never dropped, route a telemetry;
// the outbox budget is far above what a run queues, so neither drops.
func outageBridge(addr string) string {
	return fmt.Sprintf(`gateway: {name: outage}
bridges:
  - name: cloud
    address: %q
    keepalive: %s
    ack_timeout: %s
    reconnect_min: 100ms
    reconnect_max: %s
    rate: %d
    max_outbox_bytes: 1073741824
    out:
      - {filter: %q, topic: %q, qos: 1}
      - {filter: %q, topic: %q, qos: 1, class: alarm}
`, addr, outageKeepAlive, outageAckTimeout, outageReconnectMax, outageReplayRate,
		outageRoutes[0].local, outageRoutes[0].remote, outageRoutes[1].local, outageRoutes[1].remote)
}

// TestOutage builds the gateway once and runs each kind of bridge outage
// against it, each with its own gateway, upstream and cloud subscriber.
func TestOutage(t *testing.T) {
	bin := buildGateway(t, t.TempDir())
	outage := relrecord.Pick(5*time.Second, 30*time.Second)
	faults := relrecord.Pick(1, 3)
	long := relrecord.Pick(20*time.Second, 10*time.Minute)
	cases := []struct {
		test string
		c    outageCase
	}{
		{"CleanClose", outageCase{name: "clean close", faults: faults, fault: outageCleanClose(outage)}},
		{"SilentDropResume", outageCase{name: "silent drop, link resumes", proxy: true, faults: faults, fault: outageSilentDrop(outage, true)}},
		{"SilentDropClose", outageCase{name: "silent drop, proxy closes", proxy: true, faults: faults, fault: outageSilentDrop(outage, false)}},
		{"RestartWithSession", outageCase{name: "upstream restart with its session", faults: faults, fault: outageRestartKept(outage)}},
		{"RestartWithoutSession", outageCase{name: "upstream restart without its session", faults: faults, fault: outageRestartWiped(outage)}},
		{"LongOutage", outageCase{name: "long outage", faults: 1, fault: outageCleanClose(long)}},
	}
	for _, tc := range cases {
		t.Run(tc.test, func(t *testing.T) { outageRun(t, bin, tc.c) })
	}
}

// outageCase is one kind of outage.
type outageCase struct {
	name   string // the record's case name
	proxy  bool   // the bridge reaches the upstream through a faultproxy
	faults int    // how many times the fault is made in one run
	// fault makes the fault once and returns, with a line that describes
	// it, when it has ended: the upstream is reachable again.
	fault func(h *outageHarness) string
}

// outageHarness is one case's world: the upstream, the gateway bridging to
// it, the publisher, the cloud subscriber, and the case's record.
type outageHarness struct {
	t     *testing.T
	rec   *relrecord.Rec
	up    *mosquitto.Broker
	proxy *faultproxy.Proxy // nil unless the case needs one
	g     *gateway
	pub   *outagePublisher
	cloud *outageCloud

	noteNames []string
	notes     map[string][]string
}

// fail fails the test and records why.
func (h *outageHarness) fail(format string, args ...any) {
	h.t.Helper()
	msg := fmt.Sprintf(format, args...)
	h.t.Error(msg)
	h.rec.Fail("%s", msg)
}

// note keeps a per-fault figure; the run records each name once, with its
// values in the order of the faults.
func (h *outageHarness) note(name, format string, args ...any) {
	if _, ok := h.notes[name]; !ok {
		h.noteNames = append(h.noteNames, name)
	}
	h.notes[name] = append(h.notes[name], fmt.Sprintf(format, args...))
}

// outageProbe is a persistent session on the upstream that tells whether
// a restart kept the upstream's sessions.
const outageProbe = "outage-probe"

// upstreamKept reports whether the upstream still has the probe's session,
// and leaves one there for the next look.
func (h *outageHarness) upstreamKept() bool {
	h.t.Helper()
	c, present, err := dial(h.up.Addr(), outageProbe, false, sessionExpiry, 0)
	if err != nil {
		h.t.Fatalf("probing the upstream's sessions: %v", err)
	}
	c.disconnect()
	return present
}

// outageRun sets a case up, makes its faults under steady load, drains,
// and checks and records what arrived.
func outageRun(t *testing.T, bin string, c outageCase) {
	began := time.Now()
	h := &outageHarness{t: t, rec: relrecord.Begin(t, "bridge-outage", c.name), notes: map[string][]string{}}
	h.up = mosquitto.Start(t, mosquitto.Cloud())
	addr := h.up.Addr()
	if c.proxy {
		h.proxy = faultproxy.New(t, addr)
		addr = h.proxy.Addr()
	}
	h.cloud = newOutageCloud("outage-cloud")
	h.cloud.create(t, h.up.Addr())
	if h.upstreamKept() {
		t.Fatal("a fresh upstream already had the probe's session")
	}
	stopCloud := h.cloud.follow(h.up.Addr())
	t.Cleanup(stopCloud)

	h.g = newGatewayWith(t, bin, outageBridge(addr))
	h.g.start()
	pub, err := startOutagePublisher(h.g.addr, outageRate)
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	h.pub = pub
	t.Cleanup(pub.stop)

	// The link must carry both routes before the first fault, or the
	// case would test nothing.
	deadline := time.Now().Add(readyTimeout)
	for !h.cloud.allRoutes() {
		if time.Now().After(deadline) {
			t.Fatalf("nothing of some route reached the cloud within %s of the gateway's start", readyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(outageWarm)
	reconnects := outageSeries(t, h.g, `fieldgate_bridge_reconnects_total{bridge="cloud"}`)

	for range c.faults {
		h.note("outage", "%s", c.fault(h))
		end := time.Now()
		target := h.pub.published()
		if d, ok := h.cloud.waitPrefix(target); ok {
			h.note("drain time after reconnect", "%s", d.Sub(end).Round(time.Millisecond))
		} else {
			h.note("drain time after reconnect", "not drained in %s", time.Since(end).Round(time.Second))
			h.fail("the messages published before the fault ended had not all reached the cloud %s after it ended", time.Since(end).Round(time.Second))
		}
		time.Sleep(outageSettle)
	}
	reconnects = outageSeries(t, h.g, `fieldgate_bridge_reconnects_total{bridge="cloud"}`) - reconnects

	h.pub.stop()
	if err := h.pub.failure(); err != nil {
		h.fail("publisher: %v", err)
	}
	left := h.cloud.drainAll(h.pub)
	// QoS 1 duplicates still on their way belong in the count.
	time.Sleep(300 * time.Millisecond)
	stopCloud()
	outbox := outageSeries(t, h.g, `fieldgate_bridge_outbox_messages{bridge="cloud"}`)
	dropped := outageSeries(t, h.g, `fieldgate_bridge_messages_dropped_total{bridge="cloud"`)
	h.g.stop()

	for _, name := range h.noteNames {
		h.rec.Add(name, "%s", strings.Join(h.notes[name], "; "))
	}
	h.check(reconnects, c.faults, left, outbox, dropped)
	h.rec.Add("run time", "%s", time.Since(began).Round(time.Millisecond))
}

// check records the case's figures and fails it on a loss, a disorder, an
// unknown delivery, a publisher held back, or a fault the bridge never
// reconnected after.
func (h *outageHarness) check(reconnects float64, faults, left int, outbox, dropped float64) {
	h.t.Helper()
	l := h.pub.ledger()
	a := h.cloud.snapshot()
	var published, acked, arrived, deliveries, lost, disorder, dups, unknown int
	var perRoute, lostEx, disorderEx []string
	for r, route := range outageRoutes {
		lr, ar := l.routes[r], a.routes[r]
		published += lr.published
		acked += lr.ackedN
		deliveries += ar.deliveries
		disorder += ar.outOfOrder
		dups += ar.duplicates
		rlost := 0
		for n := 1; n <= lr.published; n++ {
			if !lr.acked[n-1] {
				continue
			}
			if ar.count(n) == 0 {
				rlost++
				if len(lostEx) < 10 {
					lostEx = append(lostEx, fmt.Sprintf("%s/%d", route.name, n))
				}
			} else {
				arrived++
			}
		}
		lost += rlost
		for n := lr.published + 1; n <= len(ar.times); n++ {
			if ar.count(n) > 0 {
				unknown++
			}
		}
		if ar.firstDisorder != "" {
			disorderEx = append(disorderEx, ar.firstDisorder)
		}
		perRoute = append(perRoute, fmt.Sprintf("%s: %d published, %d lost, %d out of order, %d duplicates",
			route.name, lr.published, rlost, ar.outOfOrder, ar.duplicates))
	}
	secs := l.ended.Sub(l.began).Seconds()
	h.rec.Add("published", "%d in %.1fs (%.1f msg/s over %d routes)", published, secs, float64(published)/secs, len(outageRoutes))
	h.rec.Add("acknowledged", "%d; refused %v; longest PUBACK wait %s", acked, l.refused, l.maxWait.Round(time.Millisecond))
	h.rec.Add("arrived upstream", "%d of the acknowledged, in %d deliveries", arrived, deliveries)
	h.rec.Add("lost", "%d", lost)
	h.rec.Add("out of order", "%d", disorder)
	h.rec.Add("duplicates", "%d", dups)
	h.rec.Add("by route", "%s", strings.Join(perRoute, "; "))
	h.rec.Add("bridge reconnects", "%.0f over %d faults", reconnects, faults)
	h.rec.Add("outbox at the end", "%.0f messages; %.0f dropped", outbox, dropped)

	if lost > 0 {
		h.fail("%d acknowledged messages never reached the cloud (%d still missing after the final drain), such as %v", lost, left, lostEx)
	}
	if disorder > 0 {
		h.fail("%d messages first arrived after a later one of their route; the first of each route: %v", disorder, disorderEx)
	}
	if unknown > 0 {
		h.fail("%d deliveries carry a number that was never published", unknown)
	}
	for _, p := range a.problems {
		h.fail("cloud subscriber: %s", p)
	}
	if published == 0 || acked < published {
		h.fail("the gateway acknowledged %d of %d messages published", acked, published)
	}
	if rate := float64(published) / secs; rate < 0.95*outageRate {
		h.fail("the publisher managed %.1f msg/s of the %d offered: the gateway held it back", rate, outageRate)
	}
	if int(reconnects) < faults {
		h.fail("the bridge reconnected %.0f times over %d faults: it did not notice them all", reconnects, faults)
	}
	if outbox != 0 {
		h.fail("the outbox still holds %.0f messages once the cloud has everything", outbox)
	}
}

// outageCleanClose stops the upstream with SIGTERM, leaves it down for
// outage, and starts it again on its saved state. mosquitto 2.0 closes its
// clients' connections as it exits, without a DISCONNECT: the bridge sees
// an orderly TCP close, then refused dials until the restart.
func outageCleanClose(outage time.Duration) func(h *outageHarness) string {
	return func(h *outageHarness) string {
		h.up.Stop()
		time.Sleep(outage)
		h.up.Start()
		return fmt.Sprintf("%s down after SIGTERM", outage)
	}
}

// outageSilentDrop freezes the proxy between the bridge and the upstream:
// nothing passes either way and nothing is closed, as when a mobile link
// or a NAT drops the path. The bridge must notice by its keepalive and ack
// timeouts and dial again (its dials go silent too). After outage the
// link resumes, passing on what it held (stale connections included), or
// the proxy closes every connection it holds and forwards new ones.
func outageSilentDrop(outage time.Duration, resume bool) func(h *outageHarness) string {
	return func(h *outageHarness) string {
		froze := time.Now()
		h.proxy.Freeze()
		time.Sleep(outage)
		noticed, ok := h.proxy.AcceptedAfter(froze)
		how := "the proxy closed every connection"
		if resume {
			h.proxy.Thaw()
			how = "the link resumed"
		} else {
			h.proxy.Cut()
		}
		// A PUBLISH written just after the freeze is overdue AckTimeout
		// later, and the bridge dials again at once; a PINGREQ is late at
		// most a keepalive more.
		bound := outageAckTimeout + outageKeepAlive + time.Second
		switch {
		case !ok:
			h.note("silence noticed after", "not within %s", outage)
			h.fail("the bridge did not dial again within the %s its link was silent", outage)
		case noticed > bound:
			h.note("silence noticed after", "%s", noticed.Round(time.Millisecond))
			h.fail("the bridge dialled again %s after its link went silent; keepalive %s and ack_timeout %s should have told it within %s",
				noticed.Round(time.Millisecond), outageKeepAlive, outageAckTimeout, bound)
		default:
			h.note("silence noticed after", "%s", noticed.Round(time.Millisecond))
		}
		return fmt.Sprintf("%s silent, then %s", outage, how)
	}
}

// outageRestartKept stops the upstream (SIGTERM) for outage and starts it
// on its saved state, then restarts it again at once while the bridge is
// replaying the backlog: the bridge resumes its session (Session Present
// 1) with messages in flight, which it must resend under their packet
// identifiers before anything new.
func outageRestartKept(outage time.Duration) func(h *outageHarness) string {
	return func(h *outageHarness) string {
		h.up.Stop()
		time.Sleep(outage)
		h.up.Start()
		left := h.midReplay(func() {
			h.up.Stop()
			h.up.Start()
		})
		if !h.upstreamKept() {
			h.fail("the upstream lost its sessions in a restart that should keep them: the case tests the wrong thing")
		}
		return fmt.Sprintf("%s down after SIGTERM, then a restart with %d messages not yet upstream", outage, left)
	}
}

// outageRestartWiped is outageRestartKept with the upstream's persistence
// wiped at each restart: the bridge finds no session (Session Present 0)
// and must send again, as new messages, everything not yet acknowledged.
// What the upstream held for the cloud subscriber would go with the wipe,
// a loss the bridge could not help, so the subscriber first takes it from
// the old state, and its session (only its own) is made again on the
// new one, as a cloud application does when its broker is rebuilt: see
// wipedRestart.
func outageRestartWiped(outage time.Duration) func(h *outageHarness) string {
	return func(h *outageHarness) string {
		began := time.Now()
		h.wipedRestart(func() { time.Sleep(outage - time.Since(began)) })
		left := h.midReplay(func() { h.wipedRestart(func() {}) })
		return fmt.Sprintf("%s down after SIGTERM, persistence wiped; then a wiped restart with %d messages not yet upstream", outage, left)
	}
}

// wipedRestart stops the upstream, lets the cloud subscriber take what the
// upstream holds for it on a private port, wipes the state, makes the
// subscriber's session again, calls wait, and starts the upstream. The
// bridge sees none of it but a stopped upstream, then one that does not
// know it.
func (h *outageHarness) wipedRestart(wait func()) {
	h.t.Helper()
	h.up.Stop()
	h.up.Aside(func(addr string) { h.cloud.drainFrom(h.t, addr) })
	h.up.Wipe()
	h.up.Aside(func(addr string) { h.cloud.create(h.t, addr) })
	wait()
	h.up.Start()
	if h.upstreamKept() {
		h.fail("the upstream still had its sessions after its persistence was wiped: the case tests the wrong thing")
	}
}

// midReplay waits until the cloud has a quarter of the backlog of the
// outage that just ended, then calls restart, and returns how many
// published messages the cloud did not have yet at the restart.
func (h *outageHarness) midReplay(restart func()) int {
	base := h.cloud.prefixSum()
	goal := base + (outageSum(h.pub.published())-base)/4
	deadline := time.Now().Add(outageDrainSlack)
	for h.cloud.prefixSum() < goal && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	left := outageSum(h.pub.published()) - h.cloud.prefixSum()
	restart()
	return left
}

func outageSum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// outageSeries returns the sum of the gateway's /metrics samples whose
// series (name and labels) starts with prefix: a whole series such as
// `name{bridge="cloud"}`, or an open one such as `name{bridge="cloud"`
// that covers every reason.
func outageSeries(t *testing.T, g *gateway, prefix string) float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: ioTimeout}).Get("http://" + g.opsAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %v", resp.Status, err)
	}
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		total += v
	}
	return total
}

// outagePublisher publishes numbered QoS 1 messages on one connection at
// a steady rate, alternating between the routes, and keeps the ledger of
// what the gateway acknowledged. The gateway is never restarted in these
// cases: the connection must last the whole run.
type outagePublisher struct {
	c    *client
	rate float64

	mu       sync.Mutex
	l        outageLedger
	flights  map[uint16]outageFlight
	nextPID  uint16
	err      error
	closing  bool
	halt     chan struct{}
	sent     chan struct{} // closed when the publishing loop has ended
	read     chan struct{} // closed when the reader has ended
	stopOnce sync.Once
}

// outageLedger is what the publisher published and the gateway
// acknowledged, by route.
type outageLedger struct {
	routes       []outageRouteLedger
	refused      map[byte]int // acknowledgements with a failure code, by code
	maxWait      time.Duration
	began, ended time.Time
}

type outageRouteLedger struct {
	published int    // numbers 1 to published went out
	acked     []bool // acked[n-1]: number n had its PUBACK 0x00
	ackedN    int
}

type outageFlight struct {
	route, n int
	at       time.Time
}

// startOutagePublisher connects to addr and starts publishing rate
// messages a second.
func startOutagePublisher(addr string, rate float64) (*outagePublisher, error) {
	c, _, err := dial(addr, "outage-pub", true, 0, 0)
	if err != nil {
		return nil, err
	}
	p := &outagePublisher{
		c: c, rate: rate,
		l:       outageLedger{routes: make([]outageRouteLedger, len(outageRoutes)), refused: map[byte]int{}, began: time.Now()},
		flights: map[uint16]outageFlight{},
		halt:    make(chan struct{}), sent: make(chan struct{}), read: make(chan struct{}),
	}
	go p.readAcks()
	go p.publish()
	return p, nil
}

// publish keeps the number published at rate times the time elapsed,
// within the window of unacknowledged messages.
func (p *outagePublisher) publish() {
	defer close(p.sent)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	total := 0
	for {
		select {
		case <-p.halt:
			return
		case <-tick.C:
		}
		due := int(time.Since(p.l.began).Seconds() * p.rate)
		for total < due {
			p.mu.Lock()
			if p.err != nil || len(p.flights) >= outageWindow {
				p.mu.Unlock()
				break
			}
			r := total % len(outageRoutes)
			lr := &p.l.routes[r]
			lr.published++
			lr.acked = append(lr.acked, false)
			n := lr.published
			for {
				p.nextPID++
				if _, busy := p.flights[p.nextPID]; p.nextPID != 0 && !busy {
					break
				}
			}
			pid := p.nextPID
			p.flights[pid] = outageFlight{route: r, n: n, at: time.Now()}
			p.mu.Unlock()
			total++
			route := outageRoutes[r]
			if err := p.c.publish(route.local, fmt.Sprintf("%s/%d", route.name, n), 1, pid, false); err != nil {
				p.setErr(fmt.Errorf("publishing %s/%d: %w", route.name, n, err))
				return
			}
		}
	}
}

// readAcks takes the gateway's PUBACKs into the ledger.
func (p *outagePublisher) readAcks() {
	defer close(p.read)
	for {
		pk, err := p.c.read(ioTimeout)
		if err != nil {
			p.mu.Lock()
			closing := p.closing
			p.mu.Unlock()
			if !closing {
				p.setErr(fmt.Errorf("reading PUBACKs: %w", err))
			}
			return
		}
		if pk.FixedHeader.Type != packets.Puback {
			p.setErr(fmt.Errorf("%s from the gateway, which a QoS 1 publisher does not expect", packetName(pk)))
			return
		}
		p.mu.Lock()
		f, ok := p.flights[pk.PacketID]
		if !ok {
			p.mu.Unlock()
			p.setErr(fmt.Errorf("PUBACK for packet id %d, which is not in flight", pk.PacketID))
			return
		}
		delete(p.flights, pk.PacketID)
		p.l.maxWait = max(p.l.maxWait, time.Since(f.at))
		if pk.ReasonCode < 0x80 {
			lr := &p.l.routes[f.route]
			lr.acked[f.n-1] = true
			lr.ackedN++
		} else {
			p.l.refused[pk.ReasonCode]++
		}
		p.mu.Unlock()
	}
}

func (p *outagePublisher) setErr(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

// failure returns what stopped the publisher early, if anything did.
func (p *outagePublisher) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// published returns how many messages each route has had so far.
func (p *outagePublisher) published() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := make([]int, len(p.l.routes))
	for i, lr := range p.l.routes {
		n[i] = lr.published
	}
	return n
}

// stop ends publishing, waits for the last PUBACKs and disconnects. It
// may be called more than once.
func (p *outagePublisher) stop() {
	p.stopOnce.Do(func() {
		close(p.halt)
		<-p.sent
		p.mu.Lock()
		p.l.ended = time.Now()
		p.mu.Unlock()
		deadline := time.Now().Add(ioTimeout)
		for {
			p.mu.Lock()
			waiting, failed := len(p.flights), p.err != nil
			p.mu.Unlock()
			if waiting == 0 || failed {
				break
			}
			if time.Now().After(deadline) {
				p.setErr(fmt.Errorf("%d PUBACKs still missing %s after the last publish", waiting, ioTimeout))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.mu.Lock()
		p.closing = true
		p.mu.Unlock()
		p.c.disconnect()
		<-p.read
	})
}

// ledger returns a copy of the ledger; call it after stop.
func (p *outagePublisher) ledger() outageLedger {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.l
	l.routes = make([]outageRouteLedger, len(p.l.routes))
	for i, lr := range p.l.routes {
		lr.acked = append([]bool(nil), lr.acked...)
		l.routes[i] = lr
	}
	return l
}

// outageCloud is the cloud application: a persistent session on the
// upstream subscribed to the routes' remote topics at QoS 1, online
// whenever the upstream is up, that acknowledges every message at once.
type outageCloud struct {
	id string

	mu       sync.Mutex
	routes   []outageArrivals
	last     time.Time // the last delivery
	problems []string
}

// outageArrivals is what one route delivered, by number.
type outageArrivals struct {
	times         []int32 // times[n-1]: deliveries of number n
	highest       int     // the highest number delivered
	prefix        int     // every number up to it was delivered
	deliveries    int
	duplicates    int
	outOfOrder    int
	firstDisorder string
}

func (a *outageArrivals) count(n int) int32 {
	if n < 1 || n > len(a.times) {
		return 0
	}
	return a.times[n-1]
}

// add counts a delivery of number n, as the package comment defines.
func (a *outageArrivals) add(n int) {
	for len(a.times) < n {
		a.times = append(a.times, 0)
	}
	a.deliveries++
	a.times[n-1]++
	if a.times[n-1] > 1 {
		a.duplicates++
		return
	}
	if n < a.highest {
		a.outOfOrder++
		if a.firstDisorder == "" {
			a.firstDisorder = fmt.Sprintf("%d first arrived after %d", n, a.highest)
		}
	} else {
		a.highest = n
	}
	for a.prefix < len(a.times) && a.times[a.prefix] > 0 {
		a.prefix++
	}
}

func newOutageCloud(id string) *outageCloud {
	return &outageCloud{id: id, routes: make([]outageArrivals, len(outageRoutes))}
}

// create makes the cloud's session on the upstream at addr, afresh, with
// its subscription.
func (c *outageCloud) create(t *testing.T, addr string) {
	t.Helper()
	cl, _, err := dial(addr, c.id, true, sessionExpiry, 0)
	if err != nil {
		t.Fatalf("cloud subscriber: %v", err)
	}
	if err := cl.subscribe("up/#", 1); err != nil {
		t.Fatalf("cloud subscriber: %v", err)
	}
	cl.disconnect()
	// mosquitto writes to its persistence file only the sessions whose
	// last connection did not ask for a clean start: resume it once.
	cl, present, err := dial(addr, c.id, false, sessionExpiry, 0)
	if err != nil || !present {
		t.Fatalf("cloud subscriber: resuming the session just made: present %t, %v", present, err)
	}
	cl.disconnect()
}

// follow keeps the cloud connected to addr, resuming its session after
// every restart of the upstream, until the returned stop is called.
func (c *outageCloud) follow(addr string) (stop func()) {
	halt, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-halt:
				return
			default:
			}
			cl, present, err := dial(addr, c.id, false, sessionExpiry, 0)
			if err != nil {
				// The upstream is down: try again soon.
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if !present {
				c.problem("its session was gone when it connected again")
			}
			_ = c.receive(cl, halt, 0)
			cl.close()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(halt)
			<-done
		})
	}
}

// drainFrom takes everything the cloud's session holds on the upstream at
// addr, until nothing comes for a second.
func (c *outageCloud) drainFrom(t *testing.T, addr string) {
	t.Helper()
	cl, present, err := dial(addr, c.id, false, sessionExpiry, 0)
	if err != nil {
		t.Fatalf("cloud subscriber, draining the stopped upstream: %v", err)
	}
	if !present {
		c.problem("its session was gone from the stopped upstream's state")
	}
	if err := c.receive(cl, nil, time.Second); err != nil {
		t.Fatalf("cloud subscriber, draining the stopped upstream: %v", err)
	}
	cl.disconnect()
}

// receive takes and acknowledges messages until halt is closed, or
// nothing comes for quiet (0: no such limit), when it returns nil, or the
// connection fails.
func (c *outageCloud) receive(cl *client, halt <-chan struct{}, quiet time.Duration) error {
	wait := quiet
	if wait == 0 {
		wait = 100 * time.Millisecond
	}
	for {
		select {
		case <-halt:
			return nil
		default:
		}
		pk, err := cl.read(wait)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if quiet > 0 {
				return nil
			}
			continue
		}
		if err != nil {
			return err
		}
		switch pk.FixedHeader.Type {
		case packets.Publish:
			c.record(pk)
			if err := cl.ack(packets.Puback, pk.PacketID); err != nil {
				return err
			}
		case packets.Disconnect:
			return fmt.Errorf("DISCONNECT 0x%02x from the upstream", pk.ReasonCode)
		default:
			c.problem("%s from the upstream, unexpected by a subscriber", packetName(pk))
		}
	}
}

// record counts one delivery.
func (c *outageCloud) record(pk *packets.Packet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = time.Now()
	payload := string(pk.Payload)
	if q := pk.FixedHeader.Qos; q != 1 {
		c.problemLocked("%q came at QoS %d; the route and the subscription are at QoS 1", payload, q)
	}
	for r, route := range outageRoutes {
		if pk.TopicName != route.remote {
			continue
		}
		name, num, _ := strings.Cut(payload, "/")
		n, err := strconv.Atoi(num)
		if name != route.name || err != nil || n < 1 {
			c.problemLocked("%q on %s is not a message of route %s", payload, pk.TopicName, route.name)
			return
		}
		c.routes[r].add(n)
		return
	}
	c.problemLocked("%q on %s, which no route publishes to", payload, pk.TopicName)
}

func (c *outageCloud) problem(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.problemLocked(format, args...)
}

func (c *outageCloud) problemLocked(format string, args ...any) {
	if len(c.problems) < 20 {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
	}
}

// allRoutes reports whether every route has delivered something.
func (c *outageCloud) allRoutes() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.routes {
		if a.deliveries == 0 {
			return false
		}
	}
	return true
}

// prefixSum is how many messages, over the routes, have arrived with
// every earlier one of their route.
func (c *outageCloud) prefixSum() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.routes {
		n += a.prefix
	}
	return n
}

// waitPrefix waits until every route has delivered all its numbers up to
// target, and returns when that was; false once that takes three times as
// long as the backlog should at the bridge's rate, and outageDrainSlack
// more.
func (c *outageCloud) waitPrefix(target []int) (time.Time, bool) {
	backlog := outageSum(target) - c.prefixSum()
	expect := time.Duration(float64(backlog) / (outageReplayRate - outageRate) * float64(time.Second))
	deadline := time.Now().Add(outageDrainSlack + 3*expect)
	for {
		c.mu.Lock()
		done := true
		for r, a := range c.routes {
			done = done && a.prefix >= target[r]
		}
		c.mu.Unlock()
		if done {
			return time.Now(), true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drainAll waits, the publisher stopped, until the cloud has every
// message the gateway acknowledged, or until nothing has arrived for
// outageQuiet with some still missing; it returns how many are missing.
func (c *outageCloud) drainAll(p *outagePublisher) int {
	l := p.ledger()
	for {
		missing := 0
		c.mu.Lock()
		for r, lr := range l.routes {
			a := &c.routes[r]
			for n := a.prefix + 1; n <= lr.published; n++ {
				if lr.acked[n-1] && a.count(n) == 0 {
					missing++
				}
			}
		}
		quiet := time.Since(c.last)
		c.mu.Unlock()
		if missing == 0 || quiet > outageQuiet {
			return missing
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outageSnapshot is a copy of what the cloud received.
type outageSnapshot struct {
	routes   []outageArrivals
	problems []string
}

func (c *outageCloud) snapshot() outageSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := outageSnapshot{problems: append([]string(nil), c.problems...)}
	for _, a := range c.routes {
		a.times = append([]int32(nil), a.times...)
		s.routes = append(s.routes, a)
	}
	return s
}
