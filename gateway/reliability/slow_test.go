package reliability

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The slow-consumer case: "one subscriber reading 10 msg/s while
// publishers send 2,000 msg/s: RSS stays within the configured budgets,
// the other subscribers' p99 latency stays under 50 ms".
const (
	slowRate       = 2000 // messages a second, all publishers together
	slowPublishers = 4
	// slowPayload is large for a sensor reading, so that a queue that
	// ignored its budget would grow by megabytes a second and stand out
	// of the RSS bound within the short run.
	slowPayload = 512
	slowTopic   = "slow/"
	// slowPubWindow is the QoS 1 publishes a publisher has unacknowledged:
	// the broker's receive maximum.
	slowPubWindow = 64
	slowNormal    = 3 // subscribers that keep up and measure latency

	// slowReadEvery paces the slow subscribers at 10 messages a second;
	// slowReceiveMax keeps their QoS 1 window small and slowRecvBuf their
	// socket's receive buffer, so that what they cannot take waits in the
	// gateway, under its budgets (the gateway caps its sockets' send
	// buffers, so the kernel holds little beyond them).
	slowReadEvery  = 100 * time.Millisecond
	slowReceiveMax = 10
	slowRecvBuf    = 4 << 10

	// slowClientBudget is broker.max_queued_bytes, each client's budget:
	// the default. slowStoreBudget is storage.max_queued_bytes, for every
	// persistent session together.
	slowClientBudget = 1 << 20
	slowStoreBudget  = 4 << 20
	// slowCounted is what the broker counts against a budget for one of
	// these messages: topic and payload twice, and 256 bytes.
	slowCounted = int64(2*(len(slowTopic)+1+slowPayload) + 256)
	// slowPinned is the memory a queued message pins for each byte its
	// budget counts (1,292 here), once the slow subscriber is the only one
	// still holding it: the PUBLISH body it was read into (576 bytes, its
	// size class), the encoded PUBLISH cached for the subscribers that
	// keep up (576), the message itself (192) and the queue's entry (48),
	// about 1,400 bytes.
	slowPinned = 1.1
	// slowOverhead covers what the queues' accounting leaves out: the
	// heap's overhead at this size (spans partly used, pages freed and
	// not yet returned to the kernel), bbolt's buffers and the stacks;
	// measured at 2–6 MiB on amd64.
	slowOverhead = 8 << 20

	// slowP99 is the latency the subscribers that keep up must see, on a
	// machine that gives the gateway and the test the CPU they ask for.
	slowP99 = 50 * time.Millisecond
	// slowQuiet: the subscribers are done taking what is still queued for
	// them, once the publishers are done, when none has had a message for
	// this long.
	slowQuiet = 2 * time.Second
)

// slowDrainMax bounds the wait for slowQuiet, on the suite's time scale.
var slowDrainMax = testkit.Scale(20 * time.Second)

// slowConfig has explicit budgets; the persistent slow subscriber's
// queue is trimmed by dropping its oldest QoS 1 message.
const slowConfig = `log:
  level: info
storage:
  path: %%STATE%%
  max_queued_bytes: %d
  queue_policy: drop_oldest
broker:
  allow_anonymous: true
  max_queued_bytes: %d
  receive_maximum: %d
  max_inflight: 64
  inflight_timeout: 2m
  sys_interval: 0s
listeners:
  - name: mqtt
    type: tcp
    address: %%ADDR%%
ops:
  address: %%OPS%%
sensors: []
outputs: []
`

// slowKind is one of the ways a subscriber can be slow; each takes a
// different path through the broker's queues.
type slowKind struct {
	id      string
	qos     byte
	expiry  uint32 // 0: the session ends with the connection
	explain string // what the broker is to do once its queue is full
}

var slowKinds = []slowKind{
	{"slow-stored", 1, 600, "persistent session: queue_policy drop_oldest drops its oldest QoS 1 message"},
	{"slow-clean", 1, 0, "session without expiry: a QoS 1 message past its budget is dropped"},
	{"slow-qos0", 0, 0, "QoS 0 subscription: messages past its budget are dropped"},
}

// TestSlowConsumer publishes 2,000 QoS 1 messages a second from four
// publishers to three subscribers that keep up, first alone (the
// control), then with three more that read ten messages a second, one
// for each way a queue fills (persistent, clean session, QoS 0). With
// the slow subscribers the gateway's RSS must stay within the configured
// budgets and the subscribers that keep up must see a p99 latency under
// 50 ms; they must receive every message the broker acknowledged.
func TestSlowConsumer(t *testing.T) {
	control := relrecord.Pick(5*time.Second, 30*time.Second)
	duration := relrecord.Pick(20*time.Second, 5*time.Minute)
	rec := relrecord.Begin(t, "slow-consumer", "2000 msg/s, 3 slow subscribers")
	rec.Add("load", "%d QoS 1 msg/s of %d bytes from %d publishers to %d subscribers that keep up: %s alone, then %s with slow subscribers reading %d msg/s: %s",
		slowRate, slowPayload, slowPublishers, slowNormal, control, duration, int(time.Second/slowReadEvery), slowKindNames())
	rec.Add("budgets", "broker.max_queued_bytes %d, storage.max_queued_bytes %d, queue_policy drop_oldest",
		slowClientBudget, slowStoreBudget)

	bin := buildGateway(t, t.TempDir())
	g := newGatewayYAML(t, bin, fmt.Sprintf(slowConfig, slowStoreBudget, slowClientBudget, slowPubWindow))
	g.start()

	perPub := int((control+duration)/slowInterval()) + 2
	var phase atomic.Int64 // when the slow subscribers' phase began, in Unix nanoseconds
	var subs []*slowSubscriber
	for i := range slowNormal {
		s, err := slowDialSubscriber(g.addr, fmt.Sprintf("keeps-up-%d", i), 1, 0, 0, 0, perPub)
		if err != nil {
			t.Fatal(err)
		}
		s.phase = &phase
		subs = append(subs, s)
	}
	var pubs []*slowPublisher
	for i := range slowPublishers {
		p, err := slowDialPublisher(g.addr, i, perPub)
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, s := range subs {
		wg.Go(func() { s.run(0) })
		defer s.stop()
	}
	for _, p := range pubs {
		wg.Go(p.read)
		defer p.stop()
	}
	time.Sleep(time.Second) // let the connections' setup settle
	idle := g.rss()

	// The control: the load without slow subscribers.
	ctl := slowLoad(t, rec, g, pubs, control)

	// The case: the same load with the slow subscribers.
	var slow []*slowSubscriber
	for _, k := range slowKinds {
		s, err := slowDialSubscriber(g.addr, k.id, k.qos, k.expiry, slowReceiveMax, slowRecvBuf, perPub)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { s.run(slowReadEvery) })
		defer s.stop()
		slow = append(slow, s)
	}
	phase.Store(time.Now().UnixNano())
	load := slowLoad(t, rec, g, pubs, duration)

	// What the publishers achieved.
	var sent, acked, refused int
	var maxLag time.Duration
	for _, p := range pubs {
		p.mu.Lock()
		sent += p.sent
		maxLag = max(maxLag, p.maxLag)
		for _, code := range p.acks[:p.sent] {
			switch code {
			case slowAcked:
				acked++
			case slowUnacked:
			default:
				refused++
			}
		}
		p.mu.Unlock()
	}
	rec.Add("published", "%d (%.0f msg/s alone, %.0f msg/s with the slow subscribers); publisher lag behind schedule at most %s",
		sent, ctl.rate, load.rate, maxLag.Round(time.Millisecond))
	rec.Add("acknowledged", "%d (refused %d)", acked, refused)
	for _, l := range []slowPhase{ctl, load} {
		if l.rate < 0.95*slowRate {
			slowFail(t, rec, "the publishers sent %.0f msg/s, not the %d the case is about", l.rate, slowRate)
		}
	}

	// Drain: every subscriber takes what is still queued for it, the
	// slow ones now as fast as they can, so that what the broker dropped
	// for each slow one is what it never received. Done once nothing has
	// come for slowQuiet.
	type slowAtEnd struct {
		received int64
		age      time.Duration
	}
	var atEnd []slowAtEnd
	for _, s := range slow {
		atEnd = append(atEnd, slowAtEnd{s.n.Load(), time.Duration(s.lastAge.Load())})
		if err := s.hurry(); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(slowDrainMax); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !slices.ContainsFunc(slices.Concat(subs, slow), func(s *slowSubscriber) bool {
			return time.Since(time.Unix(0, s.last.Load())) < slowQuiet
		}) {
			break
		}
	}
	for _, s := range slices.Concat(subs, slow) {
		s.stop()
	}
	for _, p := range pubs {
		p.stop()
	}
	wg.Wait()

	// Memory. The bound on the gateway's RSS with the slow subscribers:
	// the most it took under the same load without them, plus for each
	// of them twice what a full queue pins (the collector, at the
	// default GOGC of 100, lets the heap grow to twice what is live
	// before it collects), plus storage.max_queued_bytes (the persistent
	// queue's pages in bbolt's memory map), plus slowOverhead.
	bound := ctl.maxRSS + int64(2*slowPinned*slowClientBudget*float64(len(slowKinds))) + slowStoreBudget + slowOverhead
	rec.Add("RSS", "%s idle; at most %s without the slow subscribers and %s with them (bound %s); heap objects at most %s and %s",
		slowMiB(idle), slowMiB(ctl.maxRSS), slowMiB(load.maxRSS), slowMiB(bound), slowMiB(ctl.maxHeap), slowMiB(load.maxHeap))
	rec.Add("RSS each second with the slow subscribers (MiB)", "%s", strings.Join(load.series, " "))
	if load.maxRSS > bound {
		slowFail(t, rec, "the gateway's RSS reached %s, past the %s the budgets allow", slowMiB(load.maxRSS), slowMiB(bound))
	}

	// What the broker dropped: once drained, each slow subscriber is
	// missing exactly what was dropped for it; the rest of the broker's
	// count was dropped for the subscribers that keep up.
	dropped := g.metric(`fieldgate_broker_messages_dropped_total{reason="queue"}`)
	refusedQ := g.metric(`fieldgate_broker_messages_dropped_total{reason="refused"}`)
	rec.Add("broker drops", "%.0f dropped from full queues, %.0f refused by a queue policy; %.0f delivered in all",
		dropped, refusedQ, g.metric("fieldgate_broker_messages_sent_total"))
	droppedSlow := 0
	for i, s := range slow {
		if s.err != nil {
			slowFail(t, rec, "%s: %v", s.id, s.err)
		}
		lost := load.sent - int(s.distinct.Load())
		droppedSlow += lost
		// What was still queued when the load stopped, in the gateway and
		// in the sockets, as the budget counts it.
		queued := s.n.Load() - atEnd[i].received
		rec.Add(s.id, "%s; received %d while the load ran, the last %s old; %d still queued when it stopped (%s as the budget counts); dropped %d",
			slowKinds[i].explain, atEnd[i].received, slowMS(atEnd[i].age), queued, slowMiB(queued*slowCounted), lost)
		if atEnd[i].received == 0 {
			slowFail(t, rec, "%s received nothing: its connection was stalled, not slow", s.id)
		}
	}
	if dropped == 0 {
		slowFail(t, rec, "no message was dropped: the slow subscribers' queues never filled, so the case did not run")
	}

	// The subscribers that keep up: loss, then latency.
	var ctlLat, lat, sock []time.Duration
	missing := 0
	for _, s := range subs {
		if s.err != nil {
			slowFail(t, rec, "%s: %v", s.id, s.err)
		}
		ctlLat = append(ctlLat, s.ctl...)
		lat = append(lat, s.lat...)
		sock = append(sock, s.sock...)
		m := 0
		for _, p := range pubs {
			for seq, code := range p.acks[:p.sent] {
				if code == slowAcked && !s.got[p.idx][seq] {
					m++
				}
			}
		}
		missing += m
		rec.Add(s.id, "received %d, duplicates %d, acknowledged but missing %d, latency at most %s", s.n.Load(), s.dups, m, slowMS(s.maxLat))
	}
	switch counted := int(dropped) - droppedSlow; {
	case missing > counted:
		slowFail(t, rec, "the subscribers that keep up are missing %d messages the broker acknowledged, and it counted %d drops for them: %d lost silently",
			missing, max(counted, 0), missing-max(counted, 0))
	case missing > 0:
		slowFail(t, rec, "the subscribers that keep up are missing %d messages the broker acknowledged: they fell behind by more than their budget holds, and the broker dropped (and counted) them",
			missing)
	}
	slices.Sort(ctlLat)
	slices.Sort(lat)
	slices.Sort(sock)
	p99 := slowQuantile(lat, 0.99)
	rec.Add("latency without the slow subscribers", "%s", slowLatencies(ctlLat))
	rec.Add("latency with the slow subscribers", "%s", slowLatencies(lat))
	if len(sock) > 0 {
		// The kernel stamps the bytes of one read with the arrival of the
		// last of them, so this part is, if anything, overstated; and a
		// subscriber that stops reading long enough to fill its socket
		// holds the gateway back, which shows here too.
		rec.Add("of which up to the subscribers' sockets", "%s (publisher, gateway and loopback; the rest is the test client's delay in reading)", slowLatencies(sock))
	}
	for _, l := range []struct {
		name string
		ph   slowPhase
	}{{"without the slow subscribers", ctl}, {"with the slow subscribers", load}} {
		secs := l.ph.elapsed.Seconds()
		rec.Add("machine "+l.name, "gateway CPU %.0f%% and test process %.0f%% of one core, %.0f state commits a second; "+
			"waiting for a CPU %.1f s a second for the gateway's threads and %.1f s for the test's; "+
			"a 1 ms sleep in the test woke late by p99 %s, max %s; load average %s",
			100*l.ph.cpuGW.Seconds()/secs, 100*l.ph.cpuTest.Seconds()/secs, l.ph.commits/secs,
			l.ph.waitGW.Seconds()/secs, l.ph.waitTest.Seconds()/secs,
			slowMS(slowQuantile(l.ph.late, 0.99)), slowMS(slowQuantile(l.ph.late, 1)), l.ph.loadAvg)
	}
	// The target is the gateway's: what a message waits for because
	// runnable threads wait for a CPU that other work holds is the
	// machine's, and the probe measured it in the same phase. So the
	// bound is slowP99 plus the probe's p99 lateness, on the suite's
	// time scale. On a quiet machine that adds a millisecond or two; on
	// a shared one it keeps the test to its question (do slow subscribers
	// hold the others back?), whose failure looks like seconds, not tens
	// of milliseconds.
	latBound := testkit.Scale(slowP99) + slowQuantile(load.late, 0.99)
	switch {
	case len(lat) == 0:
		slowFail(t, rec, "the subscribers that keep up received nothing")
	case p99 >= latBound:
		slowFail(t, rec, "p99 latency %s with the slow subscribers, not under %s (%s, plus the machine's own p99 scheduling delay %s; without them p99 %s; up to the subscribers' sockets p99 %s)",
			slowMS(p99), slowMS(latBound), slowMS(testkit.Scale(slowP99)), slowMS(slowQuantile(load.late, 0.99)), slowMS(slowQuantile(ctlLat, 0.99)), slowMS(slowQuantile(sock, 0.99)))
	}

	g.stop()
}

// slowPhase is what one phase of the load achieved, and what it cost.
type slowPhase struct {
	elapsed         time.Duration
	sent            int     // messages published
	rate            float64 // a second
	maxRSS, maxHeap int64
	series          []string // RSS each second, in MiB

	// What the machine did meanwhile, to tell a slow gateway from a
	// starved one or a slow test client.
	cpuGW, cpuTest   time.Duration   // CPU time used
	waitGW, waitTest time.Duration   // time the threads waited for a CPU
	late             []time.Duration // by how much the test's 1 ms sleeps overran, sorted
	commits          float64         // state database transactions
	loadAvg          string
}

// slowLoad runs the publishers for d, sampling the gateway's RSS and
// heap every second, and returns once every publish is acknowledged.
func slowLoad(t *testing.T, rec *relrecord.Rec, g *gateway, pubs []*slowPublisher, d time.Duration) slowPhase {
	t.Helper()
	sent := 0
	for _, p := range pubs {
		p.mu.Lock()
		sent -= p.sent
		p.mu.Unlock()
	}
	cpuGW, cpuTest := slowCPU(g.pid()), slowCPU(os.Getpid())
	waitGW, waitTest := slowRunqWait(g.pid()), slowRunqWait(os.Getpid())
	commits := g.metric("fieldgate_storage_commit_seconds_count")
	probe := slowStartProbe()
	defer probe.finish()
	start := time.Now().Add(50 * time.Millisecond)
	errs := make(chan error, len(pubs))
	for _, p := range pubs {
		go func() { errs <- p.run(start, start.Add(d)) }()
	}
	var ph slowPhase
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for running := len(pubs); running > 0; {
		select {
		case err := <-errs:
			running--
			if err != nil {
				slowFail(t, rec, "publisher: %v", err)
			}
		case <-tick.C:
			rss := g.rss()
			ph.maxRSS = max(ph.maxRSS, rss)
			ph.maxHeap = max(ph.maxHeap, int64(g.metric("go_heap_objects_bytes")))
			ph.series = append(ph.series, strconv.FormatInt(rss>>20, 10))
		}
	}
	ph.elapsed = time.Since(start)
	ph.cpuGW, ph.cpuTest = slowCPU(g.pid())-cpuGW, slowCPU(os.Getpid())-cpuTest
	ph.waitGW, ph.waitTest = slowRunqWait(g.pid())-waitGW, slowRunqWait(os.Getpid())-waitTest
	ph.commits = g.metric("fieldgate_storage_commit_seconds_count") - commits
	ph.late = probe.finish()
	ph.loadAvg = slowLoadAvg()
	last := start
	for _, p := range pubs {
		p.mu.Lock()
		sent += p.sent
		if p.lastAt.After(last) {
			last = p.lastAt
		}
		p.mu.Unlock()
	}
	// The publishers send what their schedule holds, late if they must:
	// the rate is the one they managed.
	ph.sent = sent
	ph.rate = float64(sent) / max(last.Sub(start), d).Seconds()
	return ph
}

// slowLatencies describes sorted latencies.
func slowLatencies(l []time.Duration) string {
	return fmt.Sprintf("p50 %s, p99 %s, p99.9 %s, max %s over %d messages",
		slowMS(slowQuantile(l, 0.5)), slowMS(slowQuantile(l, 0.99)), slowMS(slowQuantile(l, 0.999)), slowMS(slowQuantile(l, 1)), len(l))
}

// slowInterval is the time between two messages of one publisher.
func slowInterval() time.Duration { return time.Second * slowPublishers / slowRate }

func slowKindNames() string {
	var names []string
	for _, k := range slowKinds {
		names = append(names, k.id)
	}
	return strings.Join(names, ", ")
}

// The state of one publish in slowPublisher.acks.
const (
	slowUnacked byte = iota
	slowAcked
	// any other value is the reason code of a refusal
)

// slowPublisher sends QoS 1 messages to its own topic on a fixed
// schedule, with at most slowPubWindow unacknowledged. Each payload
// carries the time it was written, the publisher's index and a sequence
// number.
type slowPublisher struct {
	idx    int
	c      *client
	window chan struct{} // a token for each publish in flight

	mu       sync.Mutex
	inflight map[uint16]int // packet identifier → sequence number
	acks     []byte         // by sequence number: slowAcked, or the refusal's reason code

	sent    int           // publishes written
	lastAt  time.Time     // when the last was written
	maxLag  time.Duration // the most a publish was late on its schedule
	stopped atomic.Bool
}

func slowDialPublisher(addr string, idx, perPub int) (*slowPublisher, error) {
	c, _, err := dial(addr, fmt.Sprintf("slow-pub-%d", idx), true, 0, 0)
	if err != nil {
		return nil, err
	}
	return &slowPublisher{
		idx: idx, c: c,
		window:   make(chan struct{}, slowPubWindow),
		inflight: make(map[uint16]int),
		acks:     make([]byte, perPub+1),
	}, nil
}

// run publishes from start until end, then waits for the last
// acknowledgements.
func (p *slowPublisher) run(start, end time.Time) error {
	interval := slowInterval()
	payload := make([]byte, slowPayload)
	topic := slowTopic + strconv.Itoa(p.idx)
	first := p.sent
	for seq := first; seq < len(p.acks); seq++ {
		due := start.Add(time.Duration(seq-first) * interval)
		if !due.Before(end) {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		select {
		case p.window <- struct{}{}:
		case <-time.After(ioTimeout):
			return fmt.Errorf("%s: no acknowledgement for %s with %d publishes in flight", p.c.id, ioTimeout, slowPubWindow)
		}
		pid := uint16(seq%65535) + 1
		p.mu.Lock()
		p.inflight[pid] = seq
		p.mu.Unlock()
		lag := time.Since(due)
		binary.BigEndian.PutUint64(payload, uint64(time.Now().UnixNano()))
		binary.BigEndian.PutUint16(payload[8:], uint16(p.idx))
		binary.BigEndian.PutUint32(payload[10:], uint32(seq))
		if err := p.c.publish(topic, string(payload), 1, pid, false); err != nil {
			return fmt.Errorf("%s: %w", p.c.id, err)
		}
		p.mu.Lock()
		p.sent = seq + 1
		p.lastAt = time.Now()
		p.maxLag = max(p.maxLag, lag)
		p.mu.Unlock()
	}
	// A full window is every publish acknowledged; empty it for the
	// next run.
	for range slowPubWindow {
		select {
		case p.window <- struct{}{}:
		case <-time.After(ioTimeout):
			return fmt.Errorf("%s: publishes still unacknowledged %s after the last", p.c.id, ioTimeout)
		}
	}
	for range slowPubWindow {
		<-p.window
	}
	return nil
}

// read takes the PUBACKs until the connection is closed.
func (p *slowPublisher) read() {
	for {
		pk, err := p.c.read(time.Hour)
		if err != nil {
			// The publisher notices when its acknowledgements stop.
			return
		}
		if pk.FixedHeader.Type != packets.Puback {
			continue
		}
		p.mu.Lock()
		seq, ok := p.inflight[pk.PacketID]
		delete(p.inflight, pk.PacketID)
		if ok {
			p.acks[seq] = slowAcked
			if pk.ReasonCode != 0 {
				p.acks[seq] = pk.ReasonCode
			}
		}
		p.mu.Unlock()
		if ok {
			<-p.window
		}
	}
}

func (p *slowPublisher) stop() {
	if !p.stopped.Swap(true) {
		p.c.disconnect()
	}
}

// slowSubscriber subscribes to every publisher's topic and reads what
// comes, at its own pace or as fast as it can, acknowledging QoS 1.
type slowSubscriber struct {
	id       string
	c        *client
	stopped  atomic.Bool
	n        atomic.Int64 // messages received
	distinct atomic.Int64 // of them, not received before
	last     atomic.Int64 // when the last came, in Unix nanoseconds
	lastAge  atomic.Int64 // how old the last was when it came, in nanoseconds
	fast     atomic.Bool  // a slow subscriber reads as fast as it can from now on
	stopPing func()
	// phase is when the slow subscribers' phase began, in Unix
	// nanoseconds; latencies of messages written before it count as the
	// control's.
	phase *atomic.Int64

	// stamped reads with the kernel's arrival times, for the
	// subscribers that keep up; nil where the platform has none.
	stamped *slowStamped

	// Written by run, read once it has returned.
	got    [][]bool        // by publisher and sequence number
	ctl    []time.Duration // latencies in the control phase, from the publisher's write to the subscriber's read
	lat    []time.Duration // the same with the slow subscribers
	sock   []time.Duration // from the publisher's write to the subscriber's socket, with the slow subscribers
	maxLat time.Duration
	dups   int
	err    error
}

// slowDialSubscriber connects with a fresh session, asking for expiry and
// receiveMax, shrinks the socket's receive buffer to recvBuf when it is
// not 0, and subscribes to every publisher's topic at qos.
func slowDialSubscriber(addr, id string, qos byte, expiry uint32, receiveMax uint16, recvBuf, perPub int) (*slowSubscriber, error) {
	c, _, err := dial(addr, id, true, expiry, receiveMax)
	if err != nil {
		return nil, err
	}
	if recvBuf > 0 {
		if err := c.nc.(*net.TCPConn).SetReadBuffer(recvBuf); err != nil {
			c.close()
			return nil, err
		}
	}
	if err := c.subscribe(slowTopic+"#", qos); err != nil {
		c.close()
		return nil, err
	}
	s := &slowSubscriber{id: id, c: c, got: make([][]bool, slowPublishers)}
	for i := range s.got {
		s.got[i] = make([]bool, perPub+1)
	}
	if recvBuf == 0 {
		if s.stamped, err = slowNewStamped(c); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			c.close()
			return nil, err
		}
	}
	s.stopPing = slowKeepAlive(c)
	return s, nil
}

// run reads one message every pace, or as they come when pace is 0,
// until stop.
func (s *slowSubscriber) run(pace time.Duration) {
	var tick *time.Ticker
	if pace > 0 {
		tick = time.NewTicker(pace)
		defer tick.Stop()
	}
	for {
		if tick != nil && !s.fast.Load() {
			<-tick.C
		}
		var pk *packets.Packet
		var arrived time.Time
		var err error
		if s.stamped != nil {
			pk, arrived, err = s.stamped.read()
		} else {
			pk, err = s.c.read(time.Hour)
		}
		if err != nil {
			if !s.stopped.Load() {
				s.err = err
			}
			return
		}
		now := time.Now()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if pk.FixedHeader.Qos == 1 {
			if err := s.c.ack(packets.Puback, pk.PacketID); err != nil && !s.stopped.Load() {
				s.err = err
				return
			}
		}
		if len(pk.Payload) < 14 {
			s.err = fmt.Errorf("a payload of %d bytes on %s", len(pk.Payload), pk.TopicName)
			return
		}
		written := time.Unix(0, int64(binary.BigEndian.Uint64(pk.Payload)))
		age := now.Sub(written)
		pub, seq := int(binary.BigEndian.Uint16(pk.Payload[8:])), int(binary.BigEndian.Uint32(pk.Payload[10:]))
		if pub >= len(s.got) || seq >= len(s.got[pub]) {
			s.err = fmt.Errorf("message %d of publisher %d was never sent", seq, pub)
			return
		}
		if s.got[pub][seq] {
			s.dups++
		} else {
			s.got[pub][seq] = true
			s.distinct.Add(1)
		}
		s.maxLat = max(s.maxLat, age)
		s.lastAge.Store(int64(age))
		s.last.Store(now.UnixNano())
		if s.phase != nil {
			if ph := s.phase.Load(); ph == 0 || written.UnixNano() < ph {
				s.ctl = append(s.ctl, age)
			} else {
				s.lat = append(s.lat, age)
				if s.stamped != nil {
					s.sock = append(s.sock, arrived.Sub(written))
				}
			}
		}
		s.n.Add(1)
	}
}

// hurry makes a slow subscriber read as fast as it can, with a socket
// receive buffer large enough not to hold it back: with the small one,
// delayed acknowledgements and window updates pace loopback at a few
// dozen kilobytes a second.
func (s *slowSubscriber) hurry() error {
	s.fast.Store(true)
	return s.c.nc.(*net.TCPConn).SetReadBuffer(1 << 20)
}

func (s *slowSubscriber) stop() {
	if !s.stopped.Swap(true) {
		s.stopPing()
		s.c.disconnect()
	}
}

// slowKeepAlive sends c a PINGREQ every 20 seconds, so that the broker
// does not take a client that only reads (or only waits) for gone: its
// keep alive is 60 seconds. It stops when the returned function is
// called. The PINGRESPs reach c's reader, which skips them. The
// connection storm's helper client uses it too.
func slowKeepAlive(c *client) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				c.wmu.Lock()
				_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
				_, _ = c.nc.Write([]byte{packets.Pingreq << 4, 0})
				c.wmu.Unlock()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// slowQuantile returns the q quantile of sorted durations; 0 for none.
func slowQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

// slowCPU returns the CPU time (user and system) process pid has used,
// from /proc/PID/stat; 0 where it cannot be read.
func slowCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th of them, in
	// clock ticks of 1/100 s (USER_HZ on Linux).
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// slowRunqWait returns how long the threads of process pid have waited
// on a run queue for a CPU, from /proc/PID/task/*/schedstat; threads that
// have exited are not counted.
func slowRunqWait(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/schedstat")
		if err != nil {
			continue
		}
		// Time on a CPU, time waiting for one (both in nanoseconds), and
		// the number of time slices.
		if f := strings.Fields(string(b)); len(f) >= 2 {
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	return sum
}

// slowProbe measures how late the test process's goroutines are
// scheduled: a goroutine sleeps a millisecond at a time and records by
// how much each sleep overran.
type slowProbe struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
	late []time.Duration
}

func slowStartProbe() *slowProbe {
	p := &slowProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(time.Millisecond)
			p.late = append(p.late, time.Since(t0)-time.Millisecond)
		}
	}()
	return p
}

// finish stops the probe and returns its delays, sorted.
func (p *slowProbe) finish() []time.Duration {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		slices.Sort(p.late)
	})
	return p.late
}

// slowLoadAvg is the machine's one-minute load average, as /proc has it.
func slowLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// slowMiB formats a size in MiB, for this case's figures and the
// connection storm's.
func slowMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func slowMS(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// slowFail records a failure of a case (this one's or the connection
// storm's) and fails the test.
func slowFail(t *testing.T, rec *relrecord.Rec, format string, args ...any) {
	t.Helper()
	rec.Fail(format, args...)
	t.Errorf(format, args...)
}
