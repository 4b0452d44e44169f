package brokerbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The bridge scenarios (bench-bridge.sh, cmd/bridgeload) measure a broker
// that bridges its local topics to an upstream broker through an outage of
// the upstream. Three roles, each a command of its own so that the script
// can stop and start the brokers between them:
//
//   - PublishN: while the upstream is down, publishers send N numbered QoS 1
//     messages to the broker under test as fast as it acknowledges them
//     (scenario "outage"): PUBACKs per second, and bytes the broker wrote
//     to disk per message.
//   - Count: a persistent QoS 1 session on the upstream, subscribed to
//     every bridged topic, that counts the numbered messages arriving once
//     the upstream is back: how long the bridge takes to deliver all N
//     (the drain), how many arrived at all, and how many twice. With a
//     live address it also publishes to the broker under test while the
//     drain runs, to show what the drain leaves of the broker's capacity.
//   - PublishOne: one QoS 1 message on the probe topic, which the counter
//     reports when it arrives, so the script knows the bridge is up.
//
// Topics: the outage messages go to BridgeOutTopic/i (publisher i), the
// live ones to BridgeLiveTopic/0, the probe to BridgeProbeTopic; the
// bridges carry BridgeFilter. Each outage message carries its number, from
// 0 to N-1, in the first 8 bytes of its payload (big endian), so that the
// counter tells every message apart whatever the topic or order.

// Topics and the filter the bridges carry.
const (
	BridgeFilter     = "bench/#"
	BridgeOutTopic   = "bench/out"
	BridgeLiveTopic  = "bench/live"
	BridgeProbeTopic = "bench/probe"
)

// Events the counter appends to its events file, one per line, for the
// script to wait for.
const (
	EventSubscribed = "subscribed" // the session is subscribed: start the broker under test
	EventProbe      = "probe"      // the probe message arrived: the bridge is up
	EventDown       = "down"       // the upstream went away
	EventUp         = "up"         // connected again after EventDown
	EventFirst      = "first"      // the first outage message arrived
	EventDone       = "done"       // the count is over (all N, idle or limit)
)

// idBytes is the message number at the start of an outage payload.
const idBytes = 8

// redialEvery is the counter's pause between attempts to reach the
// upstream while it is down: it is back in the session within this of the
// upstream's listening.
const redialEvery = 20 * time.Millisecond

// PublishN runs the outage phase: pubs publishers share n numbered QoS 1
// messages (publisher i sends numbers i, i+pubs, i+2·pubs, …) on topic
// BridgeOutTopic/i, each keeping cfg.Window unacknowledged, from the moment
// all are connected until the last PUBACK. Figures: acks/s; with cfg.PID,
// disk-B/msg and disk-MiB, the growth of the broker's write_bytes over the
// same interval.
func PublishN(ctx context.Context, cfg *Config, scenario string, n, pubs int) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: scenario}
	if n <= 0 || pubs <= 0 || cfg.Payload < idBytes {
		return res, fmt.Errorf("%s: needs messages, publishers and a payload of %d bytes or more", scenario, idBytes)
	}
	pubs = min(pubs, n)
	f := newFleet(ctx, cfg)
	defer f.stop()

	gate := make(chan struct{})
	sent := make([]counter, pubs)
	outboxes := make([]atomic.Pointer[outbox], pubs)
	var finished atomic.Int64
	topic := func(i int) string { return BridgeOutTopic + "/" + strconv.Itoa(i) }
	if err := f.publishers(pubs, topic, 1, cfg.Payload, func(i int, o *outbox) {
		outboxes[i].Store(o)
		defer finished.Add(1)
		select {
		case <-gate:
		case <-f.ctx.Done():
			return
		}
		for id := i; id < n; id += pubs {
			ok, err := o.claim(f.ctx)
			if err == nil && ok {
				binary.BigEndian.PutUint64(o.p.payload(), uint64(id))
				err = o.c.write(o.p.b, false)
			}
			if err != nil {
				f.fail(err)
			}
			if err != nil || !ok {
				return
			}
			sent[i].n.Add(1)
		}
		if err := o.c.flush(); err != nil {
			f.fail(err)
		}
	}); err != nil {
		return res, err
	}
	f.keepAlive()

	disk0, diskErr := diskWrites(cfg.PID)
	t0 := time.Now()
	close(gate)
	// Done when every publisher has written its share and every window is
	// empty: each of the n messages is acknowledged.
	for {
		if finished.Load() == int64(pubs) && windowsEmpty(outboxes) {
			break
		}
		if !sleep(ctx, time.Millisecond) {
			return res, ctx.Err()
		}
	}
	t1 := time.Now()
	disk1, err := diskWrites(cfg.PID)
	if diskErr == nil {
		diskErr = err
	}
	acked := total(sent)
	if acked < int64(n) {
		res.Notes = append(res.Notes, fmt.Sprintf("only %d of %d messages were sent and acknowledged", acked, n))
	}
	res.add(float64(acked)/t1.Sub(t0).Seconds(), "acks/s")
	switch {
	case diskErr != nil:
		res.Notes = append(res.Notes, "no disk figures: "+diskErr.Error())
	case acked > 0:
		res.add(float64(disk1-disk0)/float64(acked), "disk-B/msg")
		res.add(float64(disk1-disk0)/(1<<20), "disk-MiB")
	}
	res.add(t1.Sub(t0).Seconds(), "publish-s")
	res.Notes = append(res.Notes, f.notes()...)
	cfg.progress("%s: %d messages acknowledged in %.2fs", scenario, acked, t1.Sub(t0).Seconds())
	return res, nil
}

func windowsEmpty(outboxes []atomic.Pointer[outbox]) bool {
	for i := range outboxes {
		if o := outboxes[i].Load(); o != nil && len(o.window) > 0 {
			return false
		}
	}
	return true
}

// PublishOne publishes one QoS 1 message on topic to the broker at addr
// and waits for its PUBACK.
func PublishOne(ctx context.Context, addr, topic string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := Dial(ctx, addr, Options{ClientID: fmt.Sprintf("probe%d", time.Now().UnixNano()%1e9), Keepalive: time.Minute, Timeout: timeout})
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := newPublishPacket(topic, 1, idBytes)
	if err != nil {
		return err
	}
	p.setID(1)
	if err := c.write(p.b, true); err != nil {
		return err
	}
	_ = c.nc.SetReadDeadline(c.deadline(ctx))
	var pk packets.Packet
	for {
		if err := c.Read(&pk); err != nil {
			return fmt.Errorf("brokerbench: waiting for PUBACK: %w", err)
		}
		if pk.FixedHeader.Type == packets.Puback {
			return nil
		}
	}
}

// PublishFor publishes on BridgeLiveTopic/i from pubs publishers, each
// keeping cfg.Window unacknowledged, as fast as the broker acknowledges,
// for d: acks/s.
func PublishFor(ctx context.Context, cfg *Config, scenario string, pubs int, d time.Duration) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: scenario}
	if pubs <= 0 || d <= 0 {
		return res, fmt.Errorf("%s: needs publishers and a duration", scenario)
	}
	f := newFleet(ctx, cfg)
	defer f.stop()
	sent := make([]counter, pubs)
	outboxes := make([]atomic.Pointer[outbox], pubs)
	var quiet atomic.Bool
	topic := func(i int) string { return BridgeLiveTopic + "/" + strconv.Itoa(i) }
	t0 := time.Now()
	if err := f.publishers(pubs, topic, 1, cfg.Payload, func(i int, o *outbox) {
		outboxes[i].Store(o)
		f.flood(o, &sent[i], &quiet)
	}); err != nil {
		return res, err
	}
	f.keepAlive()
	if !sleep(ctx, d) {
		return res, ctx.Err()
	}
	acked := total(sent)
	for i := range outboxes {
		if o := outboxes[i].Load(); o != nil {
			acked -= int64(len(o.window))
		}
	}
	res.add(float64(acked)/time.Since(t0).Seconds(), "acks/s")
	quiet.Store(true)
	res.Notes = f.notes()
	return res, nil
}

// CountConfig configures Count.
type CountConfig struct {
	Broker   string // the broker under test, for the result line
	Scenario string // drain, crash, …
	Addr     string // the upstream's host:port
	ClientID string // the counting session's client id
	N        int    // outage messages expected, numbered 0 to N-1
	// Idle ends the count when no new outage message has come for this
	// long, counted from the reconnection after the outage; Limit ends it
	// this long after that reconnection in any case.
	Idle, Limit time.Duration
	Events      string // file the events are appended to; "" for none
	// Live, when set, is the broker under test: from the first outage
	// message to the end of the count a publisher sends QoS 1 messages to
	// it on BridgeLiveTopic as fast as it acknowledges them.
	Live *Config
	// UpstreamPIDFile and BrokerPIDFile hold the process ids of the
	// upstream and of the broker under test (written by the script when it
	// starts them): their CPU time over the drain gives upstream-cpu-% and
	// broker-cpu-%. "" for none.
	UpstreamPIDFile, BrokerPIDFile string
	// NoOutage is for a count without an outage (the direct run):
	// messages arriving before any reconnection are expected.
	NoOutage  bool
	Keepalive time.Duration
	Progress  io.Writer
}

// Count is the upstream's subscriber. It connects with a persistent session
// (clean session 0), subscribes to BridgeFilter at QoS 1 and counts what
// arrives, acknowledging each message. When the upstream goes away it dials
// again every redialEvery until it is back, and counts on until all N
// outage messages have arrived, or Idle or Limit ends the count, or ctx.
//
// Figures: delivered-% and delivered (distinct outage messages), dups
// (outage messages received more than once), msgs/s and drain-s (from the
// first outage message to the last new one: the drain), wait-s (from the
// reconnection to the first outage message: the upstream's start and the
// bridge's reconnection), total-s (from the reconnection to the last new
// one), upstream-cpu-% and broker-cpu-% (with the PID files) and, with
// Live, live-acks/s, live-acked and live-delivered.
func Count(ctx context.Context, cc CountConfig) (Result, error) {
	res := Result{Broker: cc.Broker, Scenario: cc.Scenario}
	if cc.N <= 0 {
		return res, fmt.Errorf("%s: needs a message count", cc.Scenario)
	}
	k := &count{cc: cc, seen: make([]uint64, (cc.N+63)/64)}
	defer k.stopLive()
	c, err := k.dial(ctx, 10*time.Second)
	if err != nil {
		return res, err
	}
	// A read waits for the upstream without a deadline until the outage:
	// ctx ending closes the connection in use to end it.
	var current atomic.Pointer[Conn]
	current.Store(c)
	defer context.AfterFunc(ctx, func() {
		if c := current.Load(); c != nil {
			c.nc.Close()
		}
	})()
	k.event(EventSubscribed)
	if cc.NoOutage {
		// Idle and Limit count from here.
		k.up = time.Now()
	}

	var (
		pk      packets.Packet
		stopped string // why the count ended early
	)
	for k.distinct < cc.N && ctx.Err() == nil {
		var deadline time.Time
		if !k.up.IsZero() {
			deadline = k.up.Add(cc.Limit)
			if idle := k.lastNewOr(k.up).Add(cc.Idle); idle.Before(deadline) {
				deadline = idle
			}
		}
		_ = c.nc.SetReadDeadline(deadline)
		err := c.Read(&pk)
		if err == nil {
			if pk.FixedHeader.Type == packets.Publish {
				k.handle(ctx, &pk)
				if pk.FixedHeader.Qos > 0 {
					err = c.puback(pk.PacketID, !c.buffered())
				}
			}
			if err == nil {
				continue
			}
		}
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if time.Now().Before(k.up.Add(cc.Limit)) {
				stopped = fmt.Sprintf("nothing new for %v", cc.Idle)
			} else {
				stopped = fmt.Sprintf("the limit of %v after the upstream came back", cc.Limit)
			}
			break
		}
		// The upstream went away (or the link broke): come back into the
		// session as soon as it listens again.
		c.nc.Close()
		k.event(EventDown)
		limit := time.Duration(0) // no limit while the outage lasts
		if !k.up.IsZero() {
			limit = max(time.Until(k.up.Add(cc.Limit)), time.Nanosecond)
		}
		if c, err = k.redial(ctx, limit); err != nil {
			if ctx.Err() != nil {
				break
			}
			stopped = err.Error()
			c = nil
			break
		}
		current.Store(c)
		if ctx.Err() != nil {
			c.nc.Close()
			break
		}
		if k.up.IsZero() {
			k.up = time.Now()
		}
		k.event(EventUp)
	}
	end := time.Now()
	if c != nil {
		// The messages already received are acknowledged; a normal close
		// keeps the session as it is.
		_ = c.flush()
		_ = c.Close()
	}
	live, liveErr := k.stopLive()
	k.event(EventDone)

	if ctx.Err() != nil && k.distinct < cc.N {
		stopped = "interrupted"
	}
	res.add(100*float64(k.distinct)/float64(cc.N), "delivered-%")
	res.add(float64(k.distinct), "delivered")
	res.add(float64(k.dups), "dups")
	if k.distinct > 0 {
		drain := k.last.Sub(k.first)
		if drain > 0 {
			res.add(float64(k.distinct)/drain.Seconds(), "msgs/s")
		}
		res.add(drain.Seconds(), "drain-s")
		if !k.up.IsZero() && !k.first.Before(k.up) {
			res.add(k.first.Sub(k.up).Seconds(), "wait-s")
			res.add(k.last.Sub(k.up).Seconds(), "total-s")
		}
	}
	if k.preUp > 0 && !cc.NoOutage {
		res.Notes = append(res.Notes, fmt.Sprintf("%d outage messages arrived before the upstream's outage", k.preUp))
	}
	if k.bad > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d messages on %s/ without a valid number", k.bad, BridgeOutTopic))
	}
	if k.distinct < cc.N {
		why := stopped
		if why == "" {
			why = "the count ended"
		}
		res.Notes = append(res.Notes, fmt.Sprintf("%d of %d acknowledged messages arrived upstream (%s)", k.distinct, cc.N, why))
	}
	if k.distinct == cc.N && k.last.After(k.first) {
		for i, a := range k.cpu0 {
			if i < len(k.cpu1) && a.err == nil && k.cpu1[i].err == nil && a.pid == k.cpu1[i].pid {
				res.add(100*(k.cpu1[i].cpu-a.cpu).Seconds()/k.last.Sub(k.first).Seconds(), a.name+"-cpu-%")
			}
		}
	}
	if live != nil {
		res.add(live.rate, "live-acks/s")
		res.add(float64(live.acked), "live-acked")
		res.add(float64(k.live), "live-delivered")
		res.Notes = append(res.Notes, live.notes...)
	}
	if liveErr != nil {
		res.Notes = append(res.Notes, "live publisher: "+liveErr.Error())
	}
	res.Notes = append(res.Notes, k.notes...)
	k.progress("%s: %d of %d delivered, %d twice, in %.2fs after the upstream came back",
		cc.Scenario, k.distinct, cc.N, k.dups, end.Sub(k.upOr(end)).Seconds())
	return res, nil
}

// count is the state of one Count.
type count struct {
	cc       CountConfig
	seen     []uint64 // a bit per outage message
	distinct int
	dups     int
	bad      int
	preUp    int // outage messages that came before the upstream went away
	live     int // live messages that came
	probed   bool
	cpu0     []cpuSample // at the first outage message
	cpu1     []cpuSample // at the last
	sessions int         // connections made
	up       time.Time   // the first reconnection after the outage
	first    time.Time   // the first outage message
	last     time.Time   // the last new outage message
	notes    []string

	liveMu  sync.Mutex
	liveRun *liveRun
}

func (k *count) progress(format string, args ...any) {
	if k.cc.Progress != nil {
		fmt.Fprintf(k.cc.Progress, "# %s: "+format+"\n", append([]any{k.cc.Broker}, args...)...)
	}
}

func (k *count) lastNewOr(t time.Time) time.Time {
	if k.last.After(t) {
		return k.last
	}
	return t
}

func (k *count) upOr(t time.Time) time.Time {
	if k.up.IsZero() {
		return t
	}
	return k.up
}

// event appends name to the events file.
func (k *count) event(name string) {
	if k.cc.Events == "" {
		return
	}
	f, err := os.OpenFile(k.cc.Events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		k.progress("events file: %v", err)
		return
	}
	fmt.Fprintf(f, "%s %d\n", name, time.Now().UnixNano())
	f.Close()
}

func (k *count) handle(ctx context.Context, pk *packets.Packet) {
	switch topic := pk.TopicName; {
	case strings.HasPrefix(topic, BridgeOutTopic+"/"):
		if len(pk.Payload) < idBytes {
			k.bad++
			return
		}
		id := binary.BigEndian.Uint64(pk.Payload)
		if id >= uint64(k.cc.N) {
			k.bad++
			return
		}
		if k.up.IsZero() {
			k.preUp++
		}
		w, bit := id/64, uint64(1)<<(id%64)
		if k.seen[w]&bit != 0 {
			k.dups++
			return
		}
		k.seen[w] |= bit
		k.distinct++
		now := time.Now()
		k.last = now
		if k.distinct == 1 {
			k.first = now
			k.cpu0 = k.cpuTimes()
			k.event(EventFirst)
			k.startLive(ctx)
		}
		if k.distinct == k.cc.N {
			k.cpu1 = k.cpuTimes()
		}
	case strings.HasPrefix(topic, BridgeLiveTopic+"/"):
		k.live++
	case topic == BridgeProbeTopic:
		if !k.probed {
			k.probed = true
			k.event(EventProbe)
		}
	}
}

// dial connects the counting session, retrying for up to wait, and
// subscribes it unless the upstream still holds its session.
func (k *count) dial(ctx context.Context, wait time.Duration) (*Conn, error) {
	deadline := time.Now().Add(wait)
	for {
		c, err := k.connect(ctx)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return c, err
		}
		if !sleep(ctx, redialEvery) {
			return nil, ctx.Err()
		}
	}
}

// redial is dial with no time limit when limit is 0.
func (k *count) redial(ctx context.Context, limit time.Duration) (*Conn, error) {
	if limit == 0 {
		limit = 365 * 24 * time.Hour
	}
	c, err := k.dial(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("the upstream did not come back: %w", err)
	}
	return c, nil
}

func (k *count) connect(ctx context.Context) (*Conn, error) {
	c, err := Dial(ctx, k.cc.Addr, Options{
		ClientID:   k.cc.ClientID,
		Keepalive:  k.cc.Keepalive,
		ReadBuffer: subscriber.buf,
		Persistent: true,
		Timeout:    2 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	k.sessions++
	if !c.SessionPresent() {
		// A new session is expected on the first connection only.
		if k.sessions > 1 {
			k.notes = append(k.notes, "the upstream had lost the counting session; it subscribed again")
		}
		if err := c.Subscribe(ctx, []string{BridgeFilter}, 1, nil); err != nil {
			c.Close()
			return nil, err
		}
	}
	if k.cc.Keepalive > 0 {
		go pingUntilClosed(c, k.cc.Keepalive/2)
	}
	return c, nil
}

// pingUntilClosed sends PINGREQ every interval until the connection fails.
func pingUntilClosed(c *Conn, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if c.Ping() != nil {
			return
		}
	}
}

// liveRun is the publisher Count runs during the drain.
type liveRun struct {
	f      *fleet
	start  time.Time
	sent   []counter
	outbox atomic.Pointer[outbox]
	quiet  atomic.Bool
	err    error
	ready  chan struct{}
}

type liveResult struct {
	rate  float64
	acked int64
	notes []string
}

// startLive starts the live publisher, once, without holding up the reader.
func (k *count) startLive(ctx context.Context) {
	if k.cc.Live == nil {
		return
	}
	k.liveMu.Lock()
	defer k.liveMu.Unlock()
	if k.liveRun != nil {
		return
	}
	cfg := *k.cc.Live
	cfg.Dials = 1
	r := &liveRun{f: newFleet(ctx, &cfg), sent: make([]counter, 1), ready: make(chan struct{})}
	k.liveRun = r
	go func() {
		defer close(r.ready)
		topic := func(i int) string { return BridgeLiveTopic + "/" + strconv.Itoa(i) }
		r.err = r.f.publishers(1, topic, 1, cfg.Payload, func(i int, o *outbox) {
			r.outbox.Store(o)
			r.f.flood(o, &r.sent[i], &r.quiet)
		})
		// From the CONNACK on: in a drain of a fraction of a second, the
		// connection's set-up would weigh.
		r.start = time.Now()
		if r.err == nil {
			r.f.keepAlive()
		}
	}()
}

// stopLive stops the live publisher and returns its figures: PUBACKs per
// second from its start to now. It returns nil when none ran.
func (k *count) stopLive() (*liveResult, error) {
	k.liveMu.Lock()
	r := k.liveRun
	k.liveRun = nil
	k.liveMu.Unlock()
	if r == nil {
		return nil, nil
	}
	<-r.ready
	end := time.Now()
	acked := total(r.sent)
	if o := r.outbox.Load(); o != nil {
		acked -= int64(len(o.window))
	}
	r.quiet.Store(true)
	notes := r.f.notes()
	r.f.stop()
	if r.err != nil {
		return nil, r.err
	}
	return &liveResult{rate: float64(acked) / end.Sub(r.start).Seconds(), acked: acked, notes: notes}, nil
}

// cpuSample is the CPU time a process had used at one moment.
type cpuSample struct {
	name string // upstream or broker
	pid  int
	cpu  time.Duration
	err  error
}

// cpuTimes samples the upstream and the broker under test, whose ids are
// in the PID files.
func (k *count) cpuTimes() []cpuSample {
	var out []cpuSample
	for _, f := range []struct{ name, file string }{{"upstream", k.cc.UpstreamPIDFile}, {"broker", k.cc.BrokerPIDFile}} {
		if f.file == "" {
			continue
		}
		smp := cpuSample{name: f.name}
		b, err := os.ReadFile(f.file)
		if err == nil {
			smp.pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if err == nil {
			smp.cpu, err = processCPU(smp.pid)
		}
		smp.err = err
		out = append(out, smp)
	}
	return out
}

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// processCPU returns the user and system time process pid has used, from
// /proc/PID/stat.
func processCPU(pid int) (time.Duration, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted after its closing parenthesis, from field 3 (state).
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields after the command name", path, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] { // utime and stime, fields 14 and 15
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
