package reliability

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/faultproxy"
	"github.com/fieldgate/fieldgate/internal/testkit/natscluster"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The bridge-nats cases: the real gateway bridging to a cluster of three
// NATS servers with JetStream and the MQTT listener, its MQTT streams
// replicated on every node (internal/testkit/natscluster). NATS is what a
// cloud broker is and Mosquitto is not: it speaks MQTT 3.1.1 only, can
// refuse QoS 2 publishes, refuses topics that make no NATS subject by
// closing the connection, and is a cluster whose nodes fail on their own.
//
// Each gateway publishes numbered QoS 1 messages, 1, 2, 3…, on its own
// topic fieldgate/{device}/load, through a bridge out-route; NATS stores
// what it acknowledges in its MQTT message stream before the PUBACK, and
// the test reads that stream through a durable consumer made before any
// message comes (natscluster.Consume). What counts, per gateway, is in the
// order of the stream's sequence numbers:
//
//   - lost: a number the gateway acknowledged that the stream never
//     stored. It must be 0;
//   - a duplicate: a number stored again under a later sequence number.
//     QoS 1 allows them (a PUBLISH resent after a link dropped before its
//     PUBACK); they are counted, not failed. A message the consumer is
//     given again under the same sequence number is no duplicate: the
//     stream holds it once;
//   - out of order: a number first stored after a higher one of the same
//     gateway. It must be 0.
const natsSuite = "bridge-nats"

// natsBridgeName is the bridge of every gateway in these cases, as its
// metrics label it.
const natsBridgeName = "nats"

// The bridge's link settings in these cases. NATS acknowledges a QoS 1
// PUBLISH only once three nodes' stores have it, which on a loaded 2-core
// machine can take a second or more: natsAckTimeout leaves room for that
// and for a leader's election after a node dies, natsKeepAlive notices a
// silent link within a few seconds. Reconnects wait at most
// natsReconnectMax, so a node that comes back is found soon.
const (
	natsKeepAlive    = 2 * time.Second
	natsAckTimeout   = 8 * time.Second
	natsReconnectMin = 100 * time.Millisecond
	natsReconnectMax = time.Second
	// natsBridgeRate paces a backlog's replay: far above the load, so
	// that a backlog drains in seconds.
	natsBridgeRate = 2000
)

// Deadlines on the suite's time scale. Only a run with messages missing
// waits them out.
var (
	// natsDrain bounds the wait for every acknowledged message to be in
	// the stream once the load has stopped and the faults have ended.
	natsDrain = testkit.Scale(60 * time.Second)
	// natsQuiet: in that wait, no missing message stored for this long
	// means the rest are not coming.
	natsQuiet = testkit.Scale(15 * time.Second)
)

// natsBridgeOpts are what a case changes in a gateway's bridge section.
type natsBridgeOpts struct {
	qos        int    // the out-route's QoS; 0 means 1
	topicRules string // a topic_rules preset for the bridge; empty: none
}

// natsGatewayYAML is the configuration of gateway device whose bridge
// reaches NATS's MQTT listener at addr, protocol auto (MQTT 5 first, then
// 3.1.1), with one out-route that carries fieldgate/# as it is. The route
// is an alarm route and the outbox's budget far above what a run queues:
// nothing is ever dropped to make room.
func natsGatewayYAML(device, addr string, o natsBridgeOpts) string {
	qos := o.qos
	if qos == 0 {
		qos = 1
	}
	rules := ""
	if o.topicRules != "" {
		rules = fmt.Sprintf("    topic_rules: {preset: %s}\n", o.topicRules)
	}
	return fmt.Sprintf(`gateway: {name: %s}
bridges:
  - name: %s
    address: %q
    keepalive: %s
    ack_timeout: %s
    reconnect_min: %s
    reconnect_max: %s
    rate: %d
    max_outbox_bytes: 1073741824
%s    out:
      - {filter: "fieldgate/#", qos: %d, class: alarm}
`, device, natsBridgeName, addr, natsKeepAlive, natsAckTimeout, natsReconnectMin, natsReconnectMax,
		natsBridgeRate, rules, qos)
}

// natsLoadTopic is the topic gateway device's publisher numbers its
// messages on.
func natsLoadTopic(device string) string { return "fieldgate/" + device + "/load" }

// natsWorld is what the cases of one run share: the gateway binary, the
// NATS cluster and the reader of its MQTT message stream.
type natsWorld struct {
	bin     string
	cluster *natscluster.Cluster
	reader  *natscluster.Reader
	stream  *natsTally
}

// newNATSWorld builds the gateway, starts the cluster with QoS 2
// publishes refused (reject_qos2_publish; QoS 1 is what the other cases
// carry) and the reader of everything stored under fieldgate/#.
func newNATSWorld(t *testing.T) *natsWorld {
	t.Helper()
	w := &natsWorld{bin: buildGateway(t, t.TempDir()), stream: newNATSTally()}
	w.cluster = natscluster.Start(t, natscluster.Config{RejectQoS2Publish: true})
	w.reader = w.cluster.Consume(t, natscluster.MQTTStream, "fieldgate-reliability",
		natscluster.MQTTSubject("fieldgate/#"), w.stream.add)
	return w
}

// natsGateway is one gateway of a case, its publisher and, when the case
// needs one, the proxy between its bridge and NATS.
type natsGateway struct {
	device string
	g      *gateway
	proxy  *faultproxy.Proxy // nil when the bridge dials NATS directly
	pub    *natsPublisher
}

// startGateway starts gateway device bridging to node's MQTT listener
// (through a proxy when proxied), and its publisher at rate messages a
// second.
func (w *natsWorld) startGateway(t *testing.T, device string, node *natscluster.Node, proxied bool, o natsBridgeOpts, rate float64) *natsGateway {
	t.Helper()
	ng := &natsGateway{device: device}
	addr := node.MQTTAddr()
	if proxied {
		ng.proxy = faultproxy.New(t, addr)
		addr = ng.proxy.Addr()
	}
	ng.g = newGatewayWith(t, w.bin, natsGatewayYAML(device, addr, o))
	ng.g.start()
	if rate > 0 {
		ng.pub = startNATSPublisher(ng.g.addr, device+"-pub", natsLoadTopic(device), rate)
		t.Cleanup(ng.pub.stop)
	}
	return ng
}

// series sums the gateway's /metrics samples whose series begins with
// name{bridge="nats" (the rest of the labels and the brace as given).
func (ng *natsGateway) series(t *testing.T, name, labels string) float64 {
	t.Helper()
	return outageSeries(t, ng.g, fmt.Sprintf("%s{bridge=%q%s", name, natsBridgeName, labels))
}

// reconnects is the bridge's fieldgate_bridge_reconnects_total.
func (ng *natsGateway) reconnects(t *testing.T) float64 {
	t.Helper()
	return ng.series(t, "fieldgate_bridge_reconnects_total", "}")
}

// awaitFirst waits until the stream holds a message of the gateway's: the
// bridge is connected and carrying its route.
func (w *natsWorld) awaitFirst(t *testing.T, ng *natsGateway) {
	t.Helper()
	testkit.WaitFor(t, natsDrain, ng.device+"'s first message in the stream", func() bool {
		return w.stream.stored(ng.device) > 0
	})
}

// natsPublisher publishes numbered QoS 1 messages to one topic of one
// gateway at a steady rate, with at most natsWindow unacknowledged, and
// keeps the ledger of what the gateway acknowledged. When the gateway
// goes (a SIGKILL), it connects again until the gateway is back and goes
// on with the next number; what was in flight at the kill has no
// acknowledgement and is not in the ledger as acknowledged.
type natsPublisher struct {
	addr, id, topic string
	rate            float64

	mu          sync.Mutex
	published   int    // numbers 1 to published went out
	acked       []bool // acked[n-1]: number n had its PUBACK 0x00
	ackedN      int
	refused     map[byte]int
	connections int
	problems    []string
	halt        chan struct{}
	done        chan struct{}
	stopOnce    sync.Once
}

// natsWindow caps a publisher's unacknowledged messages: far above what a
// gateway that keeps up needs at the rates of these cases.
const natsWindow = 64

// startNATSPublisher starts publishing rate messages a second to topic on
// the gateway at addr as client id.
func startNATSPublisher(addr, id, topic string, rate float64) *natsPublisher {
	p := &natsPublisher{addr: addr, id: id, topic: topic, rate: rate, refused: map[byte]int{},
		halt: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *natsPublisher) halted() bool {
	select {
	case <-p.halt:
		return true
	default:
		return false
	}
}

// run connects, publishes until the connection ends, and connects again,
// until stop.
func (p *natsPublisher) run() {
	defer close(p.done)
	for !p.halted() {
		c, _, err := dial(p.addr, p.id, true, 0, 0)
		if err != nil {
			// The gateway is down: try again soon.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		p.connections++
		p.mu.Unlock()
		p.connection(c)
	}
}

// connection publishes on c at the publisher's rate, from the moment it
// connected, until c fails or stop is called; then it waits for the last
// acknowledgements and disconnects.
func (p *natsPublisher) connection(c *client) {
	var mu sync.Mutex
	flights := map[uint16]int{} // packet id → number
	var nextPID uint16
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			pk, err := c.read(ioTimeout)
			if err != nil {
				return // the gateway went, or stop closed the connection
			}
			mu.Lock()
			n, ok := flights[pk.PacketID]
			delete(flights, pk.PacketID)
			mu.Unlock()
			if pk.FixedHeader.Type != packets.Puback || !ok {
				p.problem("%s for packet id %d, which is not a QoS 1 message in flight", packetName(pk), pk.PacketID)
				c.close()
				return
			}
			p.mu.Lock()
			if pk.ReasonCode < 0x80 {
				p.acked[n-1] = true
				p.ackedN++
			} else {
				p.refused[pk.ReasonCode]++
			}
			p.mu.Unlock()
		}
	}()
	began, sent := time.Now(), 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-p.halt:
			break loop
		case <-readDone:
			return
		case <-tick.C:
		}
		for due := int(time.Since(began).Seconds() * p.rate); sent < due; sent++ {
			mu.Lock()
			if len(flights) >= natsWindow {
				mu.Unlock()
				break
			}
			for nextPID++; nextPID == 0 || flights[nextPID] != 0; nextPID++ {
			}
			p.mu.Lock()
			p.published++
			p.acked = append(p.acked, false)
			n := p.published
			p.mu.Unlock()
			flights[nextPID] = n
			pid := nextPID
			mu.Unlock()
			if err := c.publish(p.topic, strconv.Itoa(n), 1, pid, false); err != nil {
				c.close()
				<-readDone
				return
			}
		}
	}
	// Stopped: the last acknowledgements, then a clean end.
	deadline := time.Now().Add(ioTimeout)
	for {
		mu.Lock()
		waiting := len(flights)
		mu.Unlock()
		if waiting == 0 || time.Now().After(deadline) {
			if waiting > 0 {
				p.problem("%d PUBACKs still missing %s after the last publish", waiting, ioTimeout)
			}
			break
		}
		select {
		case <-readDone:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	c.disconnect()
	<-readDone
}

func (p *natsPublisher) problem(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.problems) < 10 {
		p.problems = append(p.problems, fmt.Sprintf(format, args...))
	}
}

// stop ends publishing and waits for the publisher to be done. It may be
// called more than once.
func (p *natsPublisher) stop() {
	p.stopOnce.Do(func() {
		close(p.halt)
		<-p.done
	})
}

// natsLedger is a copy of a publisher's ledger.
type natsLedger struct {
	published, ackedN, connections int
	acked                          []bool
	refused                        map[byte]int
	problems                       []string
}

func (p *natsPublisher) ledger() natsLedger {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := natsLedger{published: p.published, ackedN: p.ackedN, connections: p.connections,
		acked: append([]bool(nil), p.acked...), refused: map[byte]int{}, problems: append([]string(nil), p.problems...)}
	for k, v := range p.refused {
		l.refused[k] = v
	}
	return l
}

// natsTally is what the stream stored, by gateway, from the reader.
type natsTally struct {
	mu       sync.Mutex
	seqs     map[uint64]bool // every sequence number seen
	devices  map[string]*natsStored
	others   map[string]int // messages of other topics (availability), by topic
	problems []string
}

// natsStored is what the stream stored of one gateway's load topic.
type natsStored struct {
	entries []natsEntry // each stored copy, as the reader was given them
	copies  map[int]int // number → how many copies
}

type natsEntry struct {
	seq uint64
	n   int
}

func newNATSTally() *natsTally {
	return &natsTally{seqs: map[uint64]bool{}, devices: map[string]*natsStored{}, others: map[string]int{}}
}

// add takes one message from the reader.
func (s *natsTally) add(m natscluster.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seqs[m.Seq] {
		return // given again: the stream holds it once
	}
	s.seqs[m.Seq] = true
	topic := natscluster.MQTTTopic(m.Subject)
	levels := strings.Split(topic, "/")
	if len(levels) != 3 || levels[0] != "fieldgate" || levels[2] != "load" {
		s.others[topic]++
		return
	}
	n, err := strconv.Atoi(m.Data)
	if err != nil || n < 1 {
		if len(s.problems) < 10 {
			s.problems = append(s.problems, fmt.Sprintf("%q on %s is not a message number", m.Data, topic))
		}
		return
	}
	d := s.devices[levels[1]]
	if d == nil {
		d = &natsStored{copies: map[int]int{}}
		s.devices[levels[1]] = d
	}
	d.entries = append(d.entries, natsEntry{seq: m.Seq, n: n})
	d.copies[n]++
}

// stored returns how many distinct numbers of device the stream holds.
func (s *natsTally) stored(device string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.devices[device]; d != nil {
		return len(d.copies)
	}
	return 0
}

// other returns how many messages the stream holds on topic, which is not
// a load topic.
func (s *natsTally) other(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.others[topic]
}

// missing returns how many of the numbers l has acknowledged the stream
// does not hold yet.
func (s *natsTally) missing(device string, l natsLedger) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.devices[device]
	n := 0
	for i, ok := range l.acked {
		if ok && (d == nil || d.copies[i+1] == 0) {
			n++
		}
	}
	return n
}

// natsCount is one gateway's figures, as the package comment defines
// them.
type natsCount struct {
	published, acked, arrived, lost, duplicates, outOfOrder, unknown int
	lostExamples                                                     []int
	firstDisorder                                                    string
}

// count checks what the stream holds of device against its ledger.
func (s *natsTally) count(device string, l natsLedger) natsCount {
	s.mu.Lock()
	d := s.devices[device]
	var entries []natsEntry
	copies := map[int]int{}
	if d != nil {
		entries = append(entries, d.entries...)
		for k, v := range d.copies {
			copies[k] = v
		}
	}
	s.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool { return entries[i].seq < entries[j].seq })
	c := natsCount{published: l.published, acked: l.ackedN}
	first, highest := map[int]bool{}, 0
	for _, e := range entries {
		if first[e.n] {
			c.duplicates++
			continue
		}
		first[e.n] = true
		if e.n < highest {
			c.outOfOrder++
			if c.firstDisorder == "" {
				c.firstDisorder = fmt.Sprintf("%d first stored (sequence %d) after %d", e.n, e.seq, highest)
			}
		} else {
			highest = e.n
		}
		if e.n > l.published {
			c.unknown++
		}
	}
	for i, ok := range l.acked {
		if !ok {
			continue
		}
		if copies[i+1] == 0 {
			c.lost++
			if len(c.lostExamples) < 10 {
				c.lostExamples = append(c.lostExamples, i+1)
			}
		} else {
			c.arrived++
		}
	}
	return c
}

// tallyProblems returns what the reader was given that it could not
// count.
func (s *natsTally) tallyProblems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.problems...)
}

// natsCase is one case's record and failure reporting. Its figures go
// into the record when the test ends, in an order made for the report's
// summary, which shows the first few: the case's own first figure, then
// lost, out of order and duplicates, then the rest as added.
type natsCase struct {
	t       *testing.T
	rec     *relrecord.Rec
	figures []relrecord.Figure
	count   *natsCount
}

func newNATSCase(t *testing.T, name string) *natsCase {
	c := &natsCase{t: t, rec: relrecord.Begin(t, natsSuite, name)}
	// After relrecord's own cleanup in order, so before it in time.
	t.Cleanup(c.flush)
	return c
}

// add keeps a figure for the record.
func (c *natsCase) add(name, format string, args ...any) {
	c.figures = append(c.figures, relrecord.Figure{Name: name, Value: fmt.Sprintf(format, args...)})
}

// counted keeps the case's count of messages for the record.
func (c *natsCase) counted(n natsCount) { c.count = &n }

func (c *natsCase) flush() {
	rest := c.figures
	if len(rest) > 0 {
		c.rec.Add(rest[0].Name, "%s", rest[0].Value)
		rest = rest[1:]
	}
	if n := c.count; n != nil {
		c.rec.Add("lost", "%d", n.lost)
		c.rec.Add("out of order", "%d", n.outOfOrder)
		c.rec.Add("duplicates", "%d", n.duplicates)
		c.rec.Add("messages", "%d published, %d acknowledged, %d of those in the stream", n.published, n.acked, n.arrived)
	}
	for _, f := range rest {
		c.rec.Add(f.Name, "%s", f.Value)
	}
}

// fail fails the test and records why.
func (c *natsCase) fail(format string, args ...any) {
	c.t.Helper()
	msg := fmt.Sprintf(format, args...)
	c.t.Error(msg)
	c.rec.Fail("%s", msg)
}

// fatal is fail that ends the test.
func (c *natsCase) fatal(format string, args ...any) {
	c.t.Helper()
	c.fail(format, args...)
	c.t.FailNow()
}

// drain stops the publishers of gws and waits until the stream holds
// every message their gateways acknowledged (see await); it returns how
// long that took.
func (c *natsCase) drain(w *natsWorld, gws []*natsGateway) time.Duration {
	c.t.Helper()
	for _, ng := range gws {
		ng.pub.stop()
	}
	return c.await(w, gws, nil, "after the load stopped")
}

// await waits until the stream holds every message the gateways of gws
// acknowledged among the first upTo[i] that gateway i's publisher
// published (nil: all of them), and returns how long that took. It fails
// the case, naming when, once the count of missing messages has not
// shrunk for natsQuiet, or natsDrain has passed.
func (c *natsCase) await(w *natsWorld, gws []*natsGateway, upTo []int, when string) time.Duration {
	c.t.Helper()
	began := time.Now()
	deadline := began.Add(natsDrain)
	least, progress := -1, began
	for {
		missing := 0
		for i, ng := range gws {
			l := ng.pub.ledger()
			if upTo != nil {
				l.acked = l.acked[:upTo[i]]
			}
			missing += w.stream.missing(ng.device, l)
		}
		if missing == 0 {
			return time.Since(began)
		}
		if least < 0 || missing < least {
			least, progress = missing, time.Now()
		}
		if stalled := time.Since(progress); stalled > natsQuiet || time.Now().After(deadline) {
			c.fail("%d acknowledged messages still not in the stream %s %s (none more for %s)",
				missing, time.Since(began).Round(time.Millisecond), when, stalled.Round(time.Millisecond))
			return time.Since(began)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check counts device's messages in the stream and fails the case on a
// loss, a disorder, a number never published, or a publisher's problem;
// duplicates are counted only.
func (c *natsCase) check(w *natsWorld, ng *natsGateway) natsCount {
	c.t.Helper()
	l := ng.pub.ledger()
	n := w.stream.count(ng.device, l)
	if n.lost > 0 {
		c.fail("%s: %d acknowledged messages never reached the stream, such as %v", ng.device, n.lost, n.lostExamples)
	}
	if n.outOfOrder > 0 {
		c.fail("%s: %d messages first stored after a later one; the first: %s", ng.device, n.outOfOrder, n.firstDisorder)
	}
	if n.unknown > 0 {
		c.fail("%s: %d stored messages carry a number never published", ng.device, n.unknown)
	}
	for _, p := range l.problems {
		c.fail("%s's publisher: %s", ng.device, p)
	}
	if n.acked == 0 {
		c.fail("%s: the gateway acknowledged nothing: the case checked nothing", ng.device)
	}
	if len(l.refused) > 0 {
		c.fail("%s: the gateway refused publishes: %v (by reason code)", ng.device, l.refused)
	}
	return n
}
