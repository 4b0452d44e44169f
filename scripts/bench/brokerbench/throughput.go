package brokerbench

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// counter is a per-connection tally on a cache line of its own, so that
// readers on different cores do not contend for it.
type counter struct {
	n atomic.Int64
	_ [56]byte
}

func total(cs []counter) int64 {
	var n int64
	for i := range cs {
		n += cs[i].n.Load()
	}
	return n
}

func benchTopic(i int) string { return "bench/" + strconv.Itoa(i) }

// throughput is a scenario in which pubs publishers send as fast as the
// broker takes messages to subs subscribers over topics topics: publisher i
// sends on bench/(i mod topics) and subscriber j subscribes to
// bench/(j mod topics).
type throughput struct {
	qos                byte
	pubs, subs, topics int
}

func (t throughput) name() string { return fmt.Sprintf("qos%d-%dx%d", t.qos, t.pubs, t.subs) }

func (t throughput) run(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: t.name()}
	f := newFleet(ctx, cfg)
	defer f.stop()

	recv := make([]counter, t.subs)
	topic := func(i int) string { return benchTopic(i % t.topics) }
	if err := f.subscribers(t.subs, topic, t.qos, func(i int, _ *packets.Packet) { recv[i].n.Add(1) }); err != nil {
		return res, err
	}
	sent := make([]counter, t.pubs)
	if err := f.publishers(t.pubs, topic, t.qos, cfg.Payload, func(i int, o *outbox) {
		f.flood(o, &sent[i], nil)
	}); err != nil {
		return res, err
	}
	f.keepAlive()

	if !sleep(ctx, cfg.Warmup) {
		return res, ctx.Err()
	}
	r0, s0, t0 := total(recv), total(sent), time.Now()
	if !sleep(ctx, cfg.Duration) {
		return res, ctx.Err()
	}
	r1, s1, t1 := total(recv), total(sent), time.Now()
	secs := t1.Sub(t0).Seconds()
	res.add(float64(r1-r0)/secs, "msgs/s")
	res.add(float64(s1-s0)/secs, "sent/s")
	// Messages in flight at either end of the interval make this
	// approximate; well below 100 means the broker dropped messages. Not
	// for QoS 0 fan-out, where the few thousand messages the sockets buffer
	// between publisher and broker outnumber those published while
	// measuring (at QoS 1 the window bounds them).
	if perTopic := t.subs / t.topics; s1 > s0 && (t.qos > 0 || perTopic == 1) {
		res.add(100*float64(r1-r0)/(float64(s1-s0)*float64(perTopic)), "delivered-%")
	}
	res.Notes = f.notes()
	if r1 == r0 {
		res.Notes = append(res.Notes, "no message reached a subscriber while measuring")
	}
	return res, nil
}

// subscribers opens n subscribers, subscriber i to topic(i) at qos, each
// read on a goroutine of its own that acknowledges QoS 1 messages and hands
// every message to onMessage.
func (f *fleet) subscribers(n int, topic func(int) string, qos byte, onMessage func(i int, pk *packets.Packet)) error {
	_, err := f.dialMany(subscriber, n, func(i int, c *Conn) error {
		if err := c.Subscribe(f.ctx, []string{topic(i)}, qos, nil); err != nil {
			return err
		}
		f.serve(c, func(pk *packets.Packet) error {
			if pk.FixedHeader.Type != packets.Publish {
				return nil
			}
			onMessage(i, pk)
			if pk.FixedHeader.Qos > 0 {
				// Acks go out in batches: flushed when no more messages wait.
				return c.puback(pk.PacketID, !c.buffered())
			}
			return nil
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("subscribers: %w", err)
	}
	return nil
}

// publishers opens n publishers and runs send on a goroutine for each:
// publisher i with a PUBLISH to topic(i) and a window of cfg.Window slots.
func (f *fleet) publishers(n int, topic func(int) string, qos byte, payload int, send func(i int, o *outbox)) error {
	conns, err := f.dialMany(publisher, n, nil)
	if err != nil {
		return fmt.Errorf("publishers: %w", err)
	}
	for i, c := range conns {
		p, err := newPublishPacket(topic(i), qos, payload)
		if err != nil {
			return err
		}
		o := &outbox{c: c, p: p, qos: qos, window: make(chan struct{}, max(f.cfg.Window, 1))}
		f.serve(c, func(pk *packets.Packet) error {
			if pk.FixedHeader.Type == packets.Puback {
				select {
				case <-o.window:
				default:
				}
			}
			return nil
		})
		f.spawn(func() { send(i, o) })
	}
	return nil
}

// nextID is the packet id after id, skipping 0 [MQTT-2.3.1-1].
func nextID(id uint16) uint16 {
	if id == math.MaxUint16 {
		return 1
	}
	return id + 1
}

// outbox is one publisher: its connection, its PUBLISH and, at QoS 1, the
// window of messages awaiting PUBACK.
type outbox struct {
	c      *Conn
	p      *publishPacket
	qos    byte
	window chan struct{} // a slot per unacknowledged message; PUBACKs free them
	id     uint16        // packet id of the last message
}

// claim readies the next message: at QoS 1 it takes a window slot, first
// flushing what is buffered when the window is full so that acks can come,
// and numbers the message. It reports false when ctx ends first.
func (o *outbox) claim(ctx context.Context) (bool, error) {
	if o.qos == 0 {
		return true, nil
	}
	select {
	case o.window <- struct{}{}:
	default:
		if err := o.c.flush(); err != nil {
			return false, err
		}
		select {
		case o.window <- struct{}{}:
		case <-ctx.Done():
			return false, nil
		}
	}
	o.id = nextID(o.id)
	o.p.setID(o.id)
	return true, nil
}

// flood publishes as fast as the broker takes messages until the fleet
// stops, counting them in sent. A non-nil quiet stops it too, when set;
// it then sends what it buffered, so that every PUBLISH written gets its
// PUBACK.
func (f *fleet) flood(o *outbox, sent *counter, quiet *atomic.Bool) {
	for (quiet == nil || !quiet.Load()) && !f.stopping.Load() {
		ok, err := o.claim(f.ctx)
		if err == nil && ok {
			err = o.c.write(o.p.b, false)
		}
		if err != nil {
			f.fail(err)
		}
		if err != nil || !ok {
			return
		}
		sent.n.Add(1)
	}
	if quiet != nil {
		if err := o.c.flush(); err != nil {
			f.fail(err)
		}
	}
}

// latency is the scenario in which cfg.Pairs publishers send cfg.Rate
// messages per second in total, each to a subscriber of its own, stamping
// every payload with its send time.
type latency struct{ qos byte }

func (l latency) name(cfg *Config) string {
	return fmt.Sprintf("latency-qos%d-%dx%d-%dmps", l.qos, cfg.Pairs, cfg.Pairs, cfg.Rate)
}

func (l latency) run(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: l.name(cfg)}
	if cfg.Rate <= 0 || cfg.Pairs <= 0 {
		return res, fmt.Errorf("latency needs a positive rate and pair count, have %d and %d", cfg.Rate, cfg.Pairs)
	}
	f := newFleet(ctx, cfg)
	defer f.stop()

	// Send times travel as nanoseconds since epoch, read off the monotonic clock.
	epoch := time.Now()
	var recording atomic.Bool
	samples := make([][]time.Duration, cfg.Pairs) // each written only by its subscriber's reader
	if err := f.subscribers(cfg.Pairs, benchTopic, l.qos, func(i int, pk *packets.Packet) {
		if len(pk.Payload) >= 8 && recording.Load() {
			samples[i] = append(samples[i], time.Since(epoch)-time.Duration(binary.BigEndian.Uint64(pk.Payload)))
		}
	}); err != nil {
		return res, err
	}
	interval := time.Second * time.Duration(cfg.Pairs) / time.Duration(cfg.Rate)
	start := time.Now()
	if err := f.publishers(cfg.Pairs, benchTopic, l.qos, max(cfg.Payload, 8), func(i int, o *outbox) {
		// Publishers take turns, so the broker sees an even stream.
		f.pace(o, epoch, start.Add(interval*time.Duration(i)/time.Duration(cfg.Pairs)), interval)
	}); err != nil {
		return res, err
	}
	f.keepAlive()

	if !sleep(ctx, cfg.Warmup) {
		return res, ctx.Err()
	}
	recording.Store(true)
	t0 := time.Now()
	if !sleep(ctx, cmp.Or(cfg.LatencyDuration, cfg.Duration)) {
		return res, ctx.Err()
	}
	recording.Store(false)
	secs := time.Since(t0).Seconds()
	res.Notes = f.notes()
	f.stop() // the readers are done with samples after this

	var all []time.Duration
	for _, s := range samples {
		all = append(all, s...)
	}
	if len(all) == 0 {
		return res, fmt.Errorf("no message reached a subscriber while measuring")
	}
	slices.Sort(all)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	res.add(us(percentile(all, 0.50)), "p50-us")
	res.add(us(percentile(all, 0.90)), "p90-us")
	res.add(us(percentile(all, 0.99)), "p99-us")
	res.add(us(all[len(all)-1]), "max-us")
	res.add(float64(len(all))/secs, "msgs/s")
	return res, nil
}

// pace publishes every interval from first until the fleet stops,
// stamping each payload with the time since epoch when it is written.
func (f *fleet) pace(o *outbox, epoch, first time.Time, interval time.Duration) {
	for next := first; ; next = next.Add(interval) {
		if !sleep(f.ctx, time.Until(next)) {
			return
		}
		ok, err := o.claim(f.ctx)
		if err == nil && ok {
			binary.BigEndian.PutUint64(o.p.payload(), uint64(time.Since(epoch)))
			err = o.c.write(o.p.b, true)
		}
		if err != nil {
			f.fail(err)
		}
		if err != nil || !ok {
			return
		}
	}
}

// percentile returns the nearest-rank q-quantile of sorted, which is not empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
