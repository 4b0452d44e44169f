package sensors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
)

// Client is what the poller publishes and subscribes through: the broker's
// in-process client, seen through this narrow interface so that sensors
// does not depend on the broker.
type Client interface {
	// Publish routes one message; the broker keeps payload, so the caller
	// must not change it afterwards. QoS 1 and 2 return once stored.
	Publish(ctx context.Context, topic string, payload []byte, qos byte, retain bool) error
	// Subscribe delivers the messages matching filter to h, one at a time;
	// retained tells a retained message delivered on subscribing.
	Subscribe(filter string, qos byte, h func(topic string, payload []byte, retained bool)) error
	// RetainedTopics lists the topics with a retained message that match filter.
	RetainedTopics(filter string) []string
}

// Options configures a Poller beyond the configuration file.
type Options struct {
	Client  Client
	Buses   *Buses       // where sensors are opened; a fresh Buses when nil
	Log     *slog.Logger // nil discards
	Clock   Clock        // SystemClock when nil
	Version string       // reported in Home Assistant discovery
	Seed    uint64       // for jitter; 0 takes one from the clock
	// Alive, when set, is called whenever a sensor's loop goes round: a
	// watchdog that stops hearing it knows the poller is stuck. Reads that
	// hang in the kernel do not stop the loops (they time out).
	Alive func()
}

// retryBackoff is the first wait before retrying a failed read within one
// reading; it doubles per retry. 100 ms outlasts a bus glitch or a chip
// still converting, and two retries finish well inside any interval.
const retryBackoff = 100 * time.Millisecond

// Poller reads every configured sensor on its own schedule, publishes the
// readings, reports each sensor's health and drives the GPIO outputs.
type Poller struct {
	opts    Options
	log     *slog.Logger
	clock   Clock
	topics  topics
	gw      Gateway
	sensors []*sensor
	outputs []*output

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// busy tells a test clock how many of the poller's goroutines are
	// working rather than waiting on it, so that it moves time only when
	// all are waiting; a no-op on the system clock.
	busy func(delta int)
}

// BusyTracker is implemented by test clocks that move time only while the
// poller is idle. The poller calls Busy(-1) before a goroutine waits and
// Busy(+1) when it wakes for any reason but one of the clock's timers; the
// clock counts a timer's wake-up itself when it fires it, and takes it back
// if Stop or Reset finds the tick unreceived.
type BusyTracker interface{ Busy(delta int) }

// New checks the configuration's sensors and outputs and prepares them; it
// opens no hardware (Start does).
func New(cfg Config, opts Options) (*Poller, error) {
	if opts.Client == nil {
		return nil, errors.New("sensors: no client to publish through")
	}
	if opts.Buses == nil {
		opts.Buses = &Buses{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.Seed == 0 {
		opts.Seed = uint64(opts.Clock.Now().UnixNano())
	}
	chk := check.New(nil, false)
	cfg.Check(chk)
	if ps := chk.Problems(); len(ps) > 0 {
		errs := make([]error, len(ps))
		for i, p := range ps {
			errs[i] = fmt.Errorf("sensors: %s: %s", p.Path, p.Msg)
		}
		return nil, errors.Join(errs...)
	}
	gw := cfg.Gateway
	gw.Name = DeviceName(gw.Name)
	p := &Poller{opts: opts, log: opts.Log, clock: opts.Clock, gw: gw, topics: topics{prefix: gw.TopicPrefix, device: gw.Name}, busy: func(int) {}}
	if t, ok := opts.Clock.(BusyTracker); ok {
		p.busy = t.Busy
	}
	for i, sc := range cfg.Sensors {
		k, spec, open := parse(check.New(nil, false), i, sc)
		s := &sensor{p: p, cfg: sc, kind: k, spec: spec, open: open,
			rng: rand.New(rand.NewPCG(opts.Seed, uint64(i))), log: p.log.With("sensor", sc.Name, "kind", sc.Kind)}
		p.sensors = append(p.sensors, s)
	}
	for _, oc := range cfg.Outputs {
		p.outputs = append(p.outputs, &output{p: p, cfg: oc, log: p.log.With("output", oc.Name)})
	}
	return p, nil
}

// DeviceName returns the {device} topic level: name when set, else the
// host name reduced to letters, digits, - and _.
func DeviceName(name string) string {
	if name != "" {
		return name
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "fieldgate"
	}
	h, _, _ = strings.Cut(h, ".")
	b := []byte(strings.ToLower(h))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	return string(b)
}

// Device returns the {device} level this poller publishes under.
func (p *Poller) Device() string { return p.gw.Name }

// Start puts the outputs in their safe state, announces the gateway, and
// starts one goroutine per sensor; it returns at once. A sensor that cannot
// be opened is retried like one that fails to read.
func (p *Poller) Start(ctx context.Context) error {
	ctx, p.cancel = context.WithCancel(ctx)
	for _, o := range p.outputs {
		if err := o.start(ctx); err != nil {
			p.cancel()
			for _, o := range p.outputs {
				o.stop(ctx)
			}
			return err
		}
	}
	p.publishRetained(ctx, p.topics.availability(), []byte("online"))
	if p.gw.Discovery {
		p.discover(ctx)
		err := p.opts.Client.Subscribe(p.gw.DiscoveryPrefix+"/status", 0, func(_ string, payload []byte, _ bool) {
			if string(payload) == "online" {
				p.log.Info("Home Assistant is online; republishing discovery")
				p.discover(ctx)
			}
		})
		if err != nil {
			p.log.Warn("cannot follow Home Assistant's status", "err", err)
		}
	}
	for _, s := range p.sensors {
		p.wg.Add(1)
		p.busy(1)
		go func() {
			defer p.wg.Done()
			defer p.busy(-1)
			s.run(ctx)
		}()
	}
	p.log.Info("sensors started", "device", p.gw.Name, "sensors", len(p.sensors), "outputs", len(p.outputs))
	return nil
}

// Stop ends polling, closes every device, returns the outputs to their safe
// state and marks the gateway offline. ctx bounds the final publishes.
func (p *Poller) Stop(ctx context.Context) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.wg.Wait()
	for _, o := range p.outputs {
		o.stop(ctx)
	}
	p.publishRetained(ctx, p.topics.availability(), []byte("offline"))
	if err := p.opts.Buses.Close(); err != nil {
		p.log.Warn("closing buses", "err", err)
	}
}

func (p *Poller) publishRetained(ctx context.Context, topic string, payload []byte) {
	if err := p.opts.Client.Publish(ctx, topic, payload, 1, true); err != nil {
		p.log.Warn("publish failed", "topic", topic, "err", err)
	}
}

// topics builds the poller's topic names.
type topics struct{ prefix, device string }

func (t topics) availability() string { return t.prefix + "/" + t.device + "/availability" }
func (t topics) of(name, leaf string) string {
	return t.prefix + "/" + t.device + "/" + name + "/" + leaf
}

// Stats is one sensor's health and counters.
type Stats struct {
	Name, Kind string
	OK         bool      // the last reading succeeded
	Since      time.Time // when OK last changed
	LastError  string    // the last failure, kept after recovery
	Reads      uint64    // readings published
	Failures   map[string]uint64
	// Values are the last published values, by quantity name, with their
	// units and the time they were taken.
	Values   []Value
	LastRead time.Time
}

// Value is one quantity's last published value.
type Value struct {
	Quantity string
	Unit     string
	Value    float64
}

// Stats returns a snapshot of every sensor's health, in configuration order.
func (p *Poller) Stats() []Stats {
	out := make([]Stats, len(p.sensors))
	for i, s := range p.sensors {
		out[i] = s.stats()
	}
	return out
}

// statusPayload is what a sensor's status topic carries.
type statusPayload struct {
	State  string `json:"state"` // ok or failing
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	Since  string `json:"since"`
}

// sensor is one configured sensor and its schedule.
type sensor struct {
	p    *Poller
	cfg  Sensor
	kind Kind
	spec *Spec
	open Opener
	rng  *rand.Rand
	log  *slog.Logger

	dev     Device
	quants  []Quantity
	topics  []string
	formats []payloadFormat
	vals    []float64
	changed <-chan struct{}

	// The reader goroutine runs Device.Read so that a read stuck in the
	// kernel cannot stop the schedule: the loop gives up at the timeout and
	// issues no new read until the stuck one returns.
	reqs    chan struct{}
	results chan error
	busy    bool

	timer   Timer // the schedule
	timeout Timer // the read in progress

	mu        sync.Mutex
	ok        bool
	known     bool // a first reading was attempted
	since     time.Time
	lastErr   string
	reads     uint64
	failures  map[string]uint64
	last      []float64
	lastRead  time.Time
	pubFailed bool
}

func (s *sensor) stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Name: s.cfg.Name, Kind: s.cfg.Kind, OK: s.ok, Since: s.since, LastError: s.lastErr,
		Reads: s.reads, Failures: make(map[string]uint64, len(s.failures)), LastRead: s.lastRead}
	for k, v := range s.failures {
		st.Failures[k] = v
	}
	for i, q := range s.quants {
		if i < len(s.last) && !math.IsNaN(s.last[i]) {
			st.Values = append(st.Values, Value{Quantity: q.Name, Unit: q.Unit, Value: s.last[i]})
		}
	}
	return st
}

// run is the sensor's loop: wait for the next due time (or a change the
// device noticed), take a reading with retries, publish it, schedule the next.
func (s *sensor) run(ctx context.Context) {
	defer s.closeDevice()
	clock := s.p.clock
	interval := s.cfg.Interval
	jitter := min(s.cfg.Jitter, interval/2)
	// The first reading comes soon after start, spread over the jitter so
	// that a gateway with many sensors does not read them all at once.
	start := clock.Now()
	due := start.Add(s.spread(0, jitter))
	s.timer = clock.NewTimer(due.Sub(start))
	defer s.timer.Stop()
	fails := 0
	for {
		if alive := s.p.opts.Alive; alive != nil {
			alive()
		}
		s.p.busy(-1)
		select {
		case <-ctx.Done():
			s.p.busy(1)
			return
		case <-s.timer.C():
		case <-s.changed:
			s.p.busy(1)
			// Read now; the interval schedule is left as it is.
			s.reading(ctx)
			continue
		}
		if s.reading(ctx) {
			fails = 0
		} else {
			fails++
		}
		now := clock.Now()
		var next time.Time
		if fails > 1 {
			// A failing sensor backs off, doubling up to max_backoff, so a
			// dead device does not keep a shared bus busy.
			limit := max(s.cfg.MaxBackoff, interval)
			back := interval << min(fails-1, 30)
			if back <= 0 || back > limit {
				back = limit
			}
			next = now.Add(back)
		} else {
			// Keep to the interval grid, skipping slots already past.
			for due = due.Add(interval); !due.After(now); due = due.Add(interval) {
			}
			next = due.Add(s.spread(-jitter, jitter))
			if !next.After(now) {
				next = now.Add(time.Millisecond)
			}
		}
		s.timer.Reset(next.Sub(now))
	}
}

// spread returns a random duration in [lo, hi].
func (s *sensor) spread(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// reading takes one reading with retries and publishes it; it reports
// whether it succeeded.
func (s *sensor) reading(ctx context.Context) bool {
	var err error
	for try := 0; try <= s.cfg.Retries; try++ {
		if try > 0 && !s.sleep(ctx, retryBackoff<<(try-1)) {
			return false
		}
		if err = s.readOnce(ctx); err == nil || ctx.Err() != nil {
			break
		}
		s.count(Reason(err))
	}
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		s.setHealth(ctx, err)
		if !s.busy {
			// Reopen next time: a chip that browned out has lost its
			// configuration, and opening again sets it up.
			s.closeDevice()
		}
		return false
	}
	s.publish(ctx)
	s.setHealth(ctx, nil)
	return true
}

// sleep waits d on the clock; false if ctx ended first.
func (s *sensor) sleep(ctx context.Context, d time.Duration) bool {
	t := s.p.clock.NewTimer(d)
	defer t.Stop()
	s.p.busy(-1)
	select {
	case <-ctx.Done():
		s.p.busy(1)
		return false
	case <-t.C():
		return true
	}
}

// readOnce opens the device when needed and reads it within the timeout.
func (s *sensor) readOnce(ctx context.Context) error {
	if s.busy {
		select {
		case <-s.results: // the stuck read finally returned; its value is stale
			s.busy = false
		default:
			return fmt.Errorf("the previous read has not returned after %s: %w", s.cfg.Timeout, context.DeadlineExceeded)
		}
	}
	if s.dev == nil {
		if err := s.openDevice(ctx); err != nil {
			return err
		}
	}
	// One timer per sensor, reset for each read: no allocation per read.
	if s.timeout == nil {
		s.timeout = s.p.clock.NewTimer(s.cfg.Timeout)
	} else {
		s.timeout.Reset(s.cfg.Timeout)
	}
	t := s.timeout
	defer t.Stop()
	// The reader counts as busy from the request until its answer is
	// taken; then that count passes back to this goroutine. A read that
	// outlives its timeout keeps its count (a test device that blocks
	// hands it back while it waits).
	s.p.busy(1)
	s.reqs <- struct{}{}
	s.p.busy(-1)
	select {
	case err := <-s.results:
		return err
	case <-t.C():
		select {
		case err := <-s.results: // both were ready: the answer wins
			s.p.busy(-1) // this goroutine woke by the timer as well
			return err
		default:
		}
		s.busy = true
		return fmt.Errorf("read took longer than %s: %w", s.cfg.Timeout, context.DeadlineExceeded)
	case <-ctx.Done():
		s.busy = true
		return ctx.Err()
	}
}

func (s *sensor) openDevice(ctx context.Context) error {
	conn, err := s.p.opts.Buses.conn(s.kind, s.spec)
	if err != nil {
		return err
	}
	conn.Log = s.log
	dev, err := s.open(conn)
	if err != nil {
		return err
	}
	qs := dev.Quantities()
	if s.p.gw.Discovery && !sameQuantities(s.quantities(), qs) {
		s.p.announce(ctx, s, qs)
	}
	if s.quants == nil || !sameQuantities(s.quants, qs) {
		s.topics = make([]string, len(qs))
		s.formats = make([]payloadFormat, len(qs))
		for i, q := range qs {
			s.topics[i] = s.p.topics.of(s.cfg.Name, q.Name)
			s.formats[i] = newPayloadFormat(q)
		}
		s.vals = make([]float64, len(qs))
		s.mu.Lock()
		s.quants = qs
		s.last = make([]float64, len(qs))
		for i := range s.last {
			s.last[i] = math.NaN()
		}
		s.mu.Unlock()
	}
	s.dev = dev
	if w, ok := dev.(Watcher); ok {
		s.changed = w.Changed()
	}
	s.reqs = make(chan struct{})
	s.results = make(chan error, 1)
	reqs, results, vals := s.reqs, s.results, s.vals
	go func() {
		for range reqs {
			results <- dev.Read(ctx, vals)
		}
	}()
	s.log.Debug("sensor opened", "device", dev.String())
	return nil
}

// quantities returns what the sensor reports: from its device once opened,
// else what its driver knew from the configuration, else nil.
func (s *sensor) quantities() []Quantity {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quants != nil {
		return s.quants
	}
	return s.spec.Quantities
}

func sameQuantities(a, b []Quantity) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (s *sensor) closeDevice() {
	if s.dev == nil {
		return
	}
	close(s.reqs)
	if s.busy {
		// The reader still holds the device; it closes it when its read
		// returns, so a stuck bus cannot hang shutdown.
		dev, results := s.dev, s.results
		go func() {
			<-results
			_ = dev.Close()
		}()
	} else if err := s.dev.Close(); err != nil {
		s.log.Debug("closing sensor", "err", err)
	}
	s.dev, s.changed, s.busy = nil, nil, false
}

// publish sends every plausible value of the last reading.
func (s *sensor) publish(ctx context.Context) {
	now := s.p.clock.Now()
	published := 0
	var pubErr error
	for i, v := range s.vals {
		q := &s.quants[i]
		// NaN is a value the driver dropped as implausible (outside the
		// chip's range, or an overflow); the rest are checked here.
		if math.IsNaN(v) || math.IsInf(v, 0) || v < q.Min || v > q.Max {
			s.count(ReasonImplausible)
			s.vals[i] = math.NaN()
			continue
		}
		// The broker keeps the payload, so each gets its own exact-size
		// buffer: one allocation per published value.
		var scratch [96]byte
		b := s.formats[i].appendReading(scratch[:0], v, now)
		payload := make([]byte, len(b))
		copy(payload, b)
		if err := s.p.opts.Client.Publish(ctx, s.topics[i], payload, byte(s.cfg.QoS), s.cfg.Retain); err != nil {
			pubErr = err
			continue
		}
		published++
	}
	s.mu.Lock()
	copy(s.last, s.vals)
	s.lastRead = now
	if published > 0 {
		s.reads++
	}
	wasFailed := s.pubFailed
	s.pubFailed = pubErr != nil
	s.mu.Unlock()
	if pubErr != nil && !wasFailed && ctx.Err() == nil {
		s.log.Warn("publishing readings failed", "err", pubErr)
	} else if pubErr == nil && wasFailed {
		s.log.Info("publishing readings again")
	}
}

func (s *sensor) count(reason string) {
	s.mu.Lock()
	if s.failures == nil {
		s.failures = map[string]uint64{}
	}
	s.failures[reason]++
	s.mu.Unlock()
}

// setHealth records the outcome of a reading; a change of state is logged
// once and published, retained, on the sensor's status topic.
func (s *sensor) setHealth(ctx context.Context, err error) {
	ok := err == nil
	now := s.p.clock.Now()
	s.mu.Lock()
	changed := !s.known || s.ok != ok
	s.known = true
	if changed {
		s.ok, s.since = ok, now
	}
	if err != nil {
		s.lastErr = err.Error()
	}
	s.mu.Unlock()
	if !changed {
		return
	}
	st := statusPayload{State: "ok", Since: now.UTC().Format(tsLayout)}
	if ok {
		s.log.Info("sensor ok")
	} else {
		st.State, st.Reason, st.Error = "failing", Reason(err), err.Error()
		s.log.Warn("sensor failing", "reason", st.Reason, "err", err)
	}
	payload, _ := json.Marshal(st) // strings only: cannot fail
	s.p.publishRetained(ctx, s.p.topics.of(s.cfg.Name, "status"), payload)
}
