package sensors

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/sensors/sim"
	"periph.io/x/conn/v3/gpio"
)

// recorder is a Client that keeps what is published, with the fake time.
type recorder struct {
	clock Clock
	mu    sync.Mutex
	pubs  []pub
	subs  map[string]func(string, []byte, bool)
	kept  map[string][]byte // retained
}

type pub struct {
	at      time.Time
	topic   string
	payload string
	qos     byte
	retain  bool
}

func (r *recorder) Publish(_ context.Context, topic string, payload []byte, qos byte, retain bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pubs = append(r.pubs, pub{r.clock.Now(), topic, string(payload), qos, retain})
	if retain {
		if r.kept == nil {
			r.kept = map[string][]byte{}
		}
		if len(payload) == 0 {
			delete(r.kept, topic)
		} else {
			r.kept[topic] = payload
		}
	}
	return nil
}

func (r *recorder) Subscribe(filter string, _ byte, h func(string, []byte, bool)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subs == nil {
		r.subs = map[string]func(string, []byte, bool){}
	}
	r.subs[filter] = h
	return nil
}

func (r *recorder) RetainedTopics(filter string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for t := range r.kept {
		if topicMatches(filter, t) {
			out = append(out, t)
		}
	}
	return out
}

func (r *recorder) deliver(topic, payload string, retained bool) {
	r.mu.Lock()
	h := r.subs[topic]
	r.mu.Unlock()
	if h != nil {
		h(topic, []byte(payload), retained)
	}
}

// topicMatches is enough MQTT matching for these tests: + and a final #.
func topicMatches(filter, topic string) bool {
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, l := range f {
		if l == "#" {
			return true
		}
		if i >= len(t) || (l != "+" && l != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}

func (r *recorder) on(topic string) []pub {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pub
	for _, p := range r.pubs {
		if p.topic == topic {
			out = append(out, p)
		}
	}
	return out
}

// script is a test device: each Read takes the next step of its script, and
// repeats the last step once the script runs out.
type script struct {
	mu    sync.Mutex
	steps []step
	reads int
	block chan struct{} // a step with block waits on it
	quant []Quantity
	clock *fakeClock // told while a read blocks, so that time moves on
}

type step struct {
	vals  []float64
	err   error
	block bool
}

func (d *script) Quantities() []Quantity { return d.quant }
func (d *script) Close() error           { return nil }
func (d *script) String() string         { return "script" }

func (d *script) Read(ctx context.Context, vals []float64) error {
	d.mu.Lock()
	st := d.steps[min(d.reads, len(d.steps)-1)]
	d.reads++
	d.mu.Unlock()
	if st.block {
		// Stuck like a read in the kernel: waiting, but not on the clock.
		// Its answer comes after the poller gave up on it, so it is never
		// counted again.
		d.clock.Busy(-1)
		<-d.block
	}
	copy(vals, st.vals)
	return st.err
}

func (d *script) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reads
}

var tempQuantity = Quantity{Name: "temperature", Unit: "°C", Decimals: 2, Min: -40, Max: 85, Class: "temperature"}

// scripts hands each test its devices by sensor name.
var scripts sync.Map

func init() {
	Register(Kind{Name: "test-script", Doc: "a scripted device for poller tests", Bus: BusW1,
		Parse: func(s *Spec) Opener {
			return func(Conn) (Device, error) {
				d, ok := scripts.Load(s.Name)
				if !ok {
					return nil, fmt.Errorf("no script for %s: %w", s.Name, ErrNoAck)
				}
				return d.(*script), nil
			}
		}})
}

// pollerFor starts a poller over the YAML sensors section given, with the
// devices given by sensor name, a fake clock and a recorder.
func pollerFor(t *testing.T, sensorsYAML string, devs map[string]*script) (*Poller, *fakeClock, *recorder) {
	t.Helper()
	for name, d := range devs {
		key := t.Name() + "/" + name
		scripts.Store(key, d)
		t.Cleanup(func() { scripts.Delete(key) })
		sensorsYAML = strings.ReplaceAll(sensorsYAML, "name: "+name+"\n", "name: "+name+"\n    address: x\n")
	}
	cfg := parseConfig(t, "gateway: {name: gw1}\nsensors:\n"+sensorsYAML)
	clock := newFakeClock(t)
	rec := &recorder{clock: clock}
	for _, d := range devs {
		d.clock = clock
	}
	p, err := New(cfg, Options{Client: rec, Clock: clock, Seed: 7, Buses: &Buses{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.sensors {
		s.spec.Name = t.Name() + "/" + s.cfg.Name
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range devs {
			if d.block != nil {
				select {
				case <-d.block:
				default:
					close(d.block)
				}
			}
		}
		p.Stop(context.Background())
	})
	return p, clock, rec
}

func reading(t *testing.T, p pub) (value float64, unit string, ts time.Time) {
	t.Helper()
	var r struct {
		Value float64 `json:"value"`
		Unit  string  `json:"unit"`
		TS    string  `json:"ts"`
	}
	if err := json.Unmarshal([]byte(p.payload), &r); err != nil {
		t.Fatalf("payload %q is not JSON: %v", p.payload, err)
	}
	ts, err := time.Parse(time.RFC3339Nano, r.TS)
	if err != nil {
		t.Fatalf("ts %q is not RFC 3339: %v", r.TS, err)
	}
	return r.Value, r.Unit, ts
}

func TestPollerScheduleWithJitter(t *testing.T) {
	dev := &script{quant: []Quantity{tempQuantity}, steps: []step{{vals: []float64{21.456}}}}
	_, clock, rec := pollerFor(t, `  - name: t1
    kind: test-script
    bus: w1
    interval: 10s
    jitter: 1s
    qos: 0
    retain: true
`, map[string]*script{"t1": dev})
	start := clock.Now()
	clock.run(100 * time.Second)

	got := rec.on("fieldgate/gw1/t1/temperature")
	if len(got) < 10 || len(got) > 11 {
		t.Fatalf("got %d readings in 100s at a 10s interval, want 10 or 11", len(got))
	}
	if d := got[0].at.Sub(start); d < 0 || d > time.Second {
		t.Errorf("first reading after %s, want within the 1s jitter", d)
	}
	var offsets []time.Duration
	for i, p := range got {
		v, unit, ts := reading(t, p)
		if v != 21.46 || unit != "°C" {
			t.Errorf("reading %d = %v %q, want 21.46 °C (two decimals)", i, v, unit)
		}
		if !ts.Equal(p.at.Truncate(time.Millisecond)) {
			t.Errorf("ts %s, want the reading's time %s", ts, p.at)
		}
		if p.qos != 0 || !p.retain {
			t.Errorf("published with qos %d retain %v, want the sensor's qos 0 and retain", p.qos, p.retain)
		}
		if i > 0 {
			// Each reading is on the 10s grid that starts at the first,
			// moved by at most the jitter.
			since := got[i].at.Sub(got[0].at)
			off := since - since.Round(10*time.Second)
			if off < -time.Second || off > time.Second {
				t.Errorf("reading %d at +%s is %s off its slot", i, since, off)
			}
			offsets = append(offsets, off)
		}
	}
	same := true
	for _, o := range offsets[1:] {
		same = same && o == offsets[0]
	}
	if same {
		t.Errorf("every reading is %s off its slot; want jitter to vary", offsets[0])
	}
	if st := rec.on("fieldgate/gw1/t1/status"); len(st) != 1 || !strings.Contains(st[0].payload, `"state":"ok"`) || !st[0].retain {
		t.Errorf("status messages = %v, want one retained ok", st)
	}
}

func TestPollerRetriesThenFailsAndBacksOff(t *testing.T) {
	nack := fmt.Errorf("read 0x76: %w", ErrNoAck)
	dev := &script{quant: []Quantity{tempQuantity}, steps: []step{
		{err: nack}, {err: nack}, {vals: []float64{20}}, // reading 1 succeeds on its last retry
		{err: nack}, // and from then on every read fails
	}}
	p, clock, rec := pollerFor(t, `  - name: t1
    kind: test-script
    bus: w1
    interval: 10s
    jitter: 0s
    retries: 2
    max_backoff: 40s
`, map[string]*script{"t1": dev})
	topic := "fieldgate/gw1/t1/temperature"
	clock.run(time.Second)
	if n := len(rec.on(topic)); n != 1 {
		t.Fatalf("%d readings after the first round, want 1 (after two retries)", n)
	}
	if n := dev.count(); n != 3 {
		t.Errorf("%d reads for the first reading, want 3 (one and two retries)", n)
	}
	st := p.Stats()[0]
	if st.Failures[ReasonNoAck] != 2 || !st.OK {
		t.Errorf("stats %+v, want 2 no_ack failures and ok", st)
	}

	// From now on every read fails: 3 tries per reading, then the interval
	// doubles per failed reading up to max_backoff.
	readsBefore := dev.count()
	var attempts []time.Time
	last := dev.count()
	for range 400 {
		if !clock.step(clock.Now().Add(10 * time.Minute)) {
			break
		}
		clock.waitIdle()
		if n := dev.count(); n != last {
			if (n-readsBefore)%3 == 1 {
				attempts = append(attempts, clock.Now())
			}
			last = n
		}
		if len(attempts) == 7 {
			break
		}
	}
	if len(attempts) < 7 {
		t.Fatalf("only %d failed readings seen", len(attempts))
	}
	var gaps []time.Duration
	for i := 1; i < len(attempts); i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]).Round(time.Second))
	}
	// The readings' retries take 100+200 ms, so gaps are the wait plus 0.3s.
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second, 40 * time.Second, 40 * time.Second}
	for i := range want {
		if d := gaps[i] - want[i]; d < 0 || d > time.Second {
			t.Errorf("gap %d between failed readings = %s, want %s (+ retries)", i, gaps[i], want[i])
		}
	}
	if n := len(rec.on(topic)); n != 1 {
		t.Errorf("%d readings published, want only the first: a failed read publishes nothing", n)
	}
	status := rec.on("fieldgate/gw1/t1/status")
	if len(status) != 2 {
		t.Fatalf("status messages %v, want ok then failing, once each", status)
	}
	var s statusPayload
	if err := json.Unmarshal([]byte(status[1].payload), &s); err != nil || s.State != "failing" || s.Reason != ReasonNoAck || !strings.Contains(s.Error, "0x76") {
		t.Errorf("failing status = %s (%v), want state failing, reason no_ack and the error", status[1].payload, err)
	}
	if st := p.Stats()[0]; st.OK || st.Failures[ReasonNoAck] != 2+6*3+1 {
		t.Errorf("stats %+v, want failing with every failed try counted", st)
	}

	// Recovery: the next successful reading brings the status back and the
	// normal interval.
	dev.mu.Lock()
	dev.steps = append(dev.steps, step{vals: []float64{19}})
	dev.reads = len(dev.steps) - 1
	dev.mu.Unlock()
	clock.run(45 * time.Second)
	clock.run(30 * time.Second)
	if n := len(rec.on(topic)); n < 3 {
		t.Errorf("%d readings after recovery, want the reading and more at the 10s interval", n)
	}
	if st := rec.on("fieldgate/gw1/t1/status"); len(st) != 3 || !strings.Contains(st[2].payload, `"ok"`) {
		t.Errorf("status after recovery: %v", st)
	}
}

func TestPollerTimeoutDoesNotStopOthers(t *testing.T) {
	stuck := &script{quant: []Quantity{tempQuantity}, block: make(chan struct{}), steps: []step{{block: true, vals: []float64{1}}, {vals: []float64{2}}}}
	fine := &script{quant: []Quantity{tempQuantity}, steps: []step{{vals: []float64{3}}}}
	p, clock, rec := pollerFor(t, `  - name: stuck
    kind: test-script
    bus: w1
    interval: 5s
    timeout: 2s
    retries: 1
    jitter: 0s
  - name: fine
    kind: test-script
    bus: w1
    interval: 5s
    jitter: 0s
`, map[string]*script{"stuck": stuck, "fine": fine})
	clock.run(60 * time.Second)
	if n := len(rec.on("fieldgate/gw1/fine/temperature")); n != 12 && n != 13 {
		t.Errorf("the healthy sensor published %d readings in 60s at 5s, want 12 or 13", n)
	}
	if n := len(rec.on("fieldgate/gw1/stuck/temperature")); n != 0 {
		t.Errorf("the stuck sensor published %d readings", n)
	}
	if n := stuck.count(); n != 1 {
		t.Errorf("%d reads issued to the stuck device, want 1: no new read while one is stuck", n)
	}
	st := p.Stats()[0]
	if st.OK || st.Failures[ReasonTimeout] < 2 {
		t.Errorf("stuck sensor stats %+v, want failing with timeouts counted", st)
	}
	// The stuck read returns; the sensor reads again and recovers. Its
	// late value is stale and is not published.
	close(stuck.block)
	clock.run(5 * time.Minute)
	got := rec.on("fieldgate/gw1/stuck/temperature")
	if len(got) == 0 {
		t.Fatal("no reading after the stuck read returned")
	}
	if v, _, _ := reading(t, got[0]); v != 2 {
		t.Errorf("first reading after recovery = %v, want 2 (the stuck read's 1 is stale)", v)
	}
}

func TestPollerImplausibleValuesAreCountedNotPublished(t *testing.T) {
	dev := &script{quant: []Quantity{tempQuantity, {Name: "humidity", Unit: "%", Decimals: 1, Max: 100}}, steps: []step{
		{vals: []float64{150, 40}},          // temperature past the chip's range
		{vals: []float64{20, math.Inf(1)}},  // humidity infinite
		{vals: []float64{math.NaN(), 41.2}}, // temperature dropped by the driver
	}}
	p, clock, rec := pollerFor(t, `  - name: c
    kind: test-script
    bus: w1
    interval: 10s
    jitter: 0s
`, map[string]*script{"c": dev})
	clock.run(25 * time.Second)
	temps, hums := rec.on("fieldgate/gw1/c/temperature"), rec.on("fieldgate/gw1/c/humidity")
	if len(temps) != 1 || len(hums) != 2 {
		t.Fatalf("published %d temperatures and %d humidities, want 1 and 2", len(temps), len(hums))
	}
	if v, _, _ := reading(t, temps[0]); v != 20 {
		t.Errorf("temperature %v, want 20", v)
	}
	if st := p.Stats()[0]; st.Failures[ReasonImplausible] != 3 {
		t.Errorf("implausible count %d, want 3", st.Failures[ReasonImplausible])
	}
}

// watched is a script device that also reports changes.
type watched struct {
	*script
	ch chan struct{}
}

func (w *watched) Changed() <-chan struct{} { return w.ch }

func TestPollerReadsAtOnceOnChange(t *testing.T) {
	w := &watched{script: &script{quant: []Quantity{{Name: "state", Max: 1, Binary: true}}, steps: []step{{vals: []float64{1}}}}, ch: make(chan struct{}, 1)}
	Register(Kind{Name: "test-watched", Bus: BusW1, Parse: func(s *Spec) Opener {
		return func(Conn) (Device, error) { return w, nil }
	}})
	defer func() { kindsMu.Lock(); delete(kinds, "test-watched"); kindsMu.Unlock() }()
	_, clock, rec := pollerFor(t, `  - name: door
    kind: test-watched
    bus: w1
    address: GPIO4
    interval: 1h
    jitter: 0s
`, nil)
	clock.run(time.Second)
	topic := "fieldgate/gw1/door/state"
	if n := len(rec.on(topic)); n != 1 {
		t.Fatalf("%d readings at start, want 1", n)
	}
	w.ch <- struct{}{}
	deadline := time.Now().Add(testkit.Scale(5 * time.Second))
	for len(rec.on(topic)) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := len(rec.on(topic)); n != 2 {
		t.Errorf("%d readings after a change, want 2: a change is published at once, not at the next interval", n)
	}
}

func TestPollerRejectsBadSensorsBeforeStarting(t *testing.T) {
	cfg := decodeConfig(t, "sensors:\n  - {name: a, kind: test-script, bus: gpio, interval: 1s, options: {speed: fast}}\n")
	_, err := New(cfg, Options{Client: &recorder{}})
	if err == nil || !strings.Contains(err.Error(), "options.speed") || !strings.Contains(err.Error(), "unknown option") {
		t.Fatalf("err = %v, want the unknown option named", err)
	}
	// That a configuration file reports it on its line is
	// gateway/config's TestSensorKindProblemsCarryTheirLine.
}

func TestOutputFollowsCommandsAndKeepsSafeState(t *testing.T) {
	cfg := parseConfig(t, `gateway: {name: gw1}
outputs:
  - {name: pump, bus: sim, pin: SIM_OUT1, safe_state: "off"}
  - {name: vent, bus: sim, pin: SIM_OUT2, safe_state: "on", active_low: true}
`)
	clock := newFakeClock(t)
	rec := &recorder{clock: clock}
	buses := &Buses{}
	p, err := New(cfg, Options{Client: rec, Clock: clock, Buses: buses})
	if err != nil {
		t.Fatal(err)
	}
	world := buses.simWorld()
	level := func(pin string) gpio.Level {
		t.Helper()
		l, err := world.Level(pin)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Stop(context.Background())
		}
	}()
	state := func(name string) string {
		got := rec.on("fieldgate/gw1/" + name + "/state")
		if len(got) == 0 {
			return ""
		}
		if !got[len(got)-1].retain {
			t.Errorf("%s state not retained", name)
		}
		return got[len(got)-1].payload
	}
	// Safe states at start: pump off (line low); vent on, active low (line low).
	if state("pump") != "OFF" || level("SIM_OUT1") != gpio.Low {
		t.Errorf("pump at start: %q, line %v; want OFF, low", state("pump"), level("SIM_OUT1"))
	}
	if state("vent") != "ON" || level("SIM_OUT2") != gpio.Low {
		t.Errorf("vent at start: %q, line %v; want ON, low (active low)", state("vent"), level("SIM_OUT2"))
	}

	for _, tc := range []struct {
		payload  string
		retained bool
		want     string
		line     gpio.Level
	}{
		{"ON", false, "ON", gpio.High},
		{" off ", false, "OFF", gpio.Low},
		{"1", false, "ON", gpio.High},
		{"maybe", false, "ON", gpio.High}, // rejected: nothing changes
		{"0", true, "ON", gpio.High},      // retained: stale, ignored
		{"", false, "ON", gpio.High},      // empty: rejected
		{"0", false, "OFF", gpio.Low},
	} {
		rec.deliver("fieldgate/gw1/pump/set", tc.payload, tc.retained)
		if got := state("pump"); got != tc.want || level("SIM_OUT1") != tc.line {
			t.Errorf("after %q (retained %v): state %q line %v, want %q %v", tc.payload, tc.retained, got, level("SIM_OUT1"), tc.want, tc.line)
		}
	}
	rec.deliver("fieldgate/gw1/pump/set", "ON", false)
	rec.deliver("fieldgate/gw1/vent/set", "OFF", false)
	if level("SIM_OUT2") != gpio.High {
		t.Error("vent OFF should drive its active-low line high")
	}
	// Shutdown puts both back in their safe state and marks the gateway offline.
	p.Stop(context.Background())
	stopped = true
	if state("pump") != "OFF" || level("SIM_OUT1") != gpio.Low || state("vent") != "ON" || level("SIM_OUT2") != gpio.Low {
		t.Errorf("after stop: pump %q %v, vent %q %v; want both in their safe state", state("pump"), level("SIM_OUT1"), state("vent"), level("SIM_OUT2"))
	}
	if a := rec.on("fieldgate/gw1/availability"); len(a) != 2 || a[0].payload != "online" || a[1].payload != "offline" {
		t.Errorf("availability messages %v, want online then offline", a)
	}
}

func TestParseCommand(t *testing.T) {
	for in, want := range map[string]bool{"ON": true, "on": true, "1": true, "OFF": false, "Off": false, "0": false} {
		if got, err := parseCommand([]byte(in)); err != nil || got != want {
			t.Errorf("parseCommand(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "2", "true", "ONN", "{\"state\":\"ON\"}"} {
		if _, err := parseCommand([]byte(in)); err == nil || !strings.Contains(err.Error(), "send ON, OFF, 1 or 0") {
			t.Errorf("parseCommand(%q) = %v, want a rejection naming what is accepted", in, err)
		}
	}
}

// TestPollerPublishesSimulatedEdge runs a door contact on the simulated
// hardware and the system clock: a toggle of the line is published at
// once, long before the sensor's interval.
func TestPollerPublishesSimulatedEdge(t *testing.T) {
	w := sim.New(13)
	cfg := parseConfig(t, "gateway: {name: gw1}\nsensors:\n"+
		"  - {name: door, kind: gpio_in, bus: sim, address: "+sim.PinDoor+", interval: 1h, jitter: 0s, options: {debounce: 5ms}}\n")
	rec := &recorder{clock: SystemClock{}}
	p, err := New(cfg, Options{Client: rec, Seed: 7, Buses: &Buses{Sim: w}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(context.Background()) })
	const topic = "fieldgate/gw1/door/state"
	testkit.WaitFor(t, 5*time.Second, "the door's first reading", func() bool { return len(rec.on(topic)) == 1 })
	first, _, _ := reading(t, rec.on(topic)[0])

	if err := w.Toggle(sim.PinDoor); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the toggled door's reading", func() bool { return len(rec.on(topic)) == 2 })
	if got, _, _ := reading(t, rec.on(topic)[1]); got != 1-first {
		t.Errorf("after a toggle the door reads %v, want %v", got, 1-first)
	}
}
