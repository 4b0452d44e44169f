package sensors

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/sensors/sim"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpiotest"
	"periph.io/x/conn/v3/physic"
)

const gpioInYAML = "sensors:\n  - {name: door, kind: gpio_in, bus: gpio, address: GPIO17, interval: 1m}\n"

// fakePin is a GPIO pin for tests, after periph's gpiotest.Pin: a send
// on edges is an edge to that level, taken in by WaitForEdge. gpiotest
// itself needs github.com/jonboulle/clockwork, which this module does not
// require. Halt interrupts WaitForEdge when haltWakes is set, as the GPIO
// character device's Halt does; otherwise it does nothing, like gpiotest's.
type fakePin struct {
	edges   chan gpio.Level
	halted  chan struct{} // closed by Halt when haltWakes; nil otherwise
	halts   atomic.Int32
	waiting atomic.Int32 // calls of WaitForEdge under way
	waits   atomic.Int32 // calls of WaitForEdge made
	reads   atomic.Int32 // calls of Read made
	once    sync.Once
	inErr   error // what In returns
	edgeErr error // what In returns when asked for edge detection
	noWait  bool  // WaitForEdge returns false at once, as a pin that cannot wait

	mu   sync.Mutex
	l    gpio.Level
	pull gpio.Pull
}

func newFakePin(haltWakes bool) *fakePin {
	p := &fakePin{edges: make(chan gpio.Level)}
	if haltWakes {
		p.halted = make(chan struct{})
	}
	return p
}

// String names the pin.
func (p *fakePin) String() string { return "GPIO17" }

// Name names the pin.
func (p *fakePin) Name() string { return "GPIO17" }

// Number is the pin's GPIO number.
func (p *fakePin) Number() int { return 17 }

// Function says the pin is an input.
func (p *fakePin) Function() string { return "In" }

// Halt counts the call and, when haltWakes was set, ends every wait.
func (p *fakePin) Halt() error {
	p.halts.Add(1)
	if p.halted != nil {
		p.once.Do(func() { close(p.halted) })
	}
	return nil
}

// In sets the pull, which (as a pull would) takes the line to its level.
func (p *fakePin) In(pull gpio.Pull, edge gpio.Edge) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pull = pull
	switch pull {
	case gpio.PullUp:
		p.l = gpio.High
	case gpio.PullDown:
		p.l = gpio.Low
	}
	if edge != gpio.NoEdge && p.edgeErr != nil {
		return p.edgeErr
	}
	return p.inErr
}

// Read returns the line's level.
func (p *fakePin) Read() gpio.Level {
	p.reads.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.l
}

// WaitForEdge takes in one edge sent on edges, or gives up after timeout
// or Halt.
func (p *fakePin) WaitForEdge(timeout time.Duration) bool {
	p.waits.Add(1)
	if p.noWait {
		return false
	}
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.halted:
		return false
	case <-t.C:
		return false
	case l := <-p.edges:
		_ = p.Out(l)
		return true
	}
}

// Pull returns the pull In set.
func (p *fakePin) Pull() gpio.Pull {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pull
}

// DefaultPull reports no default.
func (p *fakePin) DefaultPull() gpio.Pull { return gpio.PullNoChange }

// Out sets the line's level without an edge.
func (p *fakePin) Out(l gpio.Level) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.l = l
	return nil
}

// PWM fails: the fake only switches.
func (p *fakePin) PWM(gpio.Duty, physic.Frequency) error { return errors.New("fakePin: no PWM") }

// openGPIOInForTest parses a gpio_in with opts and opens it on pin; it is
// closed when the test ends.
func openGPIOInForTest(t *testing.T, opts map[string]string, pin gpio.PinIO) *gpioIn {
	t.Helper()
	return openGPIOInLogged(t, opts, pin, nil)
}

// openGPIOInLogged is openGPIOInForTest with the device's log going to log.
func openGPIOInLogged(t *testing.T, opts map[string]string, pin gpio.PinIO, log *testkit.Buffer) *gpioIn {
	t.Helper()
	ps, open := parseSensorYAML(t, gpioInYAML, withOptions(opts))
	if len(ps) > 0 {
		t.Fatalf("problems: %+v", ps)
	}
	c := Conn{Pin: pin}
	if log != nil {
		c.Log = slog.New(slog.NewTextHandler(log, nil))
	}
	dev, err := open(c)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev.(*gpioIn)
}

// sendEdge makes the fake line go to l, failing if the device does not take
// the edge in.
func sendEdge(t *testing.T, p *fakePin, l gpio.Level) {
	t.Helper()
	select {
	case p.edges <- l:
	case <-time.After(testkit.Scale(2 * time.Second)):
		t.Fatalf("the device did not take the edge to %s", l)
	}
}

func readFirst(t *testing.T, d Device) float64 {
	t.Helper()
	vals := []float64{-1}
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatalf("Read: %v", err)
	}
	return vals[0]
}

// fired reports whether w's Changed fires within the given time; with
// none, whether it has fired already.
func fired(w Watcher, within time.Duration) bool {
	if within == 0 {
		select {
		case <-w.Changed():
			return true
		default:
			return false
		}
	}
	select {
	case <-w.Changed():
		return true
	case <-time.After(within):
		return false
	}
}

// eventuallyReads waits up to two seconds for d to read want.
func eventuallyReads(t *testing.T, d Device, want float64) {
	t.Helper()
	deadline := time.Now().Add(testkit.Scale(2 * time.Second))
	for {
		got := readFirst(t, d)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Read = %v, want %v", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGPIOInCleanEdge(t *testing.T) {
	p := newFakePin(true)
	d := openGPIOInForTest(t, nil, p)
	var _ Watcher = d
	if pull := p.Pull(); pull != gpio.PullUp {
		t.Errorf("pull = %s, want up by default", pull)
	}
	if qs := d.Quantities(); len(qs) != 1 || qs[0] != (Quantity{Name: "state", Max: 1, Binary: true}) {
		t.Errorf("Quantities = %+v", qs)
	}
	if got := d.String(); got != "gpio_in GPIO17 (state, both)" {
		t.Errorf("String = %q", got)
	}
	// The pull-up holds the open contact high: active low, that is 0.
	if got := readFirst(t, d); got != 0 {
		t.Fatalf("open contact reads %v, want 0", got)
	}
	start := time.Now()
	sendEdge(t, p, gpio.Low)
	if !fired(d, 2*time.Second) {
		t.Fatal("Changed did not fire on closing")
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Errorf("change accepted after %s, before the 20ms debounce", took)
	}
	if got := readFirst(t, d); got != 1 {
		t.Errorf("closed contact reads %v, want 1", got)
	}
	sendEdge(t, p, gpio.High)
	if !fired(d, 2*time.Second) {
		t.Fatal("Changed did not fire on opening")
	}
	if got := readFirst(t, d); got != 0 {
		t.Errorf("opened contact reads %v, want 0", got)
	}
}

func TestGPIOInBounce(t *testing.T) {
	for _, mode := range []string{"state", "counter"} {
		t.Run(mode, func(t *testing.T) {
			p := newFakePin(true)
			d := openGPIOInForTest(t, map[string]string{"mode": mode, "debounce": "100ms"}, p)
			// A contact closing bounces: five edges well within 100 ms
			// settle to one change.
			for _, l := range []gpio.Level{gpio.Low, gpio.High, gpio.Low, gpio.High, gpio.Low} {
				sendEdge(t, p, l)
			}
			if !fired(d, 2*time.Second) {
				t.Fatal("Changed did not fire")
			}
			if got := readFirst(t, d); got != 1 {
				t.Errorf("after the burst Read = %v, want 1", got)
			}
			if fired(d, 300*time.Millisecond) {
				t.Error("the burst made a second change")
			}
			// A glitch that is back to the accepted level when the debounce
			// time is over is no change at all.
			sendEdge(t, p, gpio.High)
			sendEdge(t, p, gpio.Low)
			if fired(d, 300*time.Millisecond) {
				t.Error("a glitch made a change")
			}
			if got := readFirst(t, d); got != 1 {
				t.Errorf("after the glitch Read = %v, want 1", got)
			}
		})
	}
}

func TestGPIOInCounter(t *testing.T) {
	p := newFakePin(true)
	d := openGPIOInForTest(t, map[string]string{"mode": "counter", "debounce": "0s"}, p)
	if qs := d.Quantities(); len(qs) != 1 || qs[0] != (Quantity{Name: "count", Max: 1e15, Total: true}) {
		t.Errorf("Quantities = %+v", qs)
	}
	if got := d.String(); got != "gpio_in GPIO17 (counter, falling)" {
		t.Errorf("String = %q", got)
	}
	const pulses = 25
	for range pulses {
		sendEdge(t, p, gpio.Low)
		sendEdge(t, p, gpio.High)
	}
	eventuallyReads(t, d, pulses)
	time.Sleep(20 * time.Millisecond)
	if got := readFirst(t, d); got != pulses {
		t.Errorf("count = %v, want %d", got, pulses)
	}
}

func TestGPIOInEdgeFilter(t *testing.T) {
	// Three falling edges and two rising ones.
	seq := []gpio.Level{gpio.Low, gpio.High, gpio.Low, gpio.High, gpio.Low}
	for _, tc := range []struct {
		edge string
		want float64
	}{{"falling", 3}, {"rising", 2}, {"both", 5}} {
		t.Run("counter "+tc.edge, func(t *testing.T) {
			p := newFakePin(true)
			d := openGPIOInForTest(t, map[string]string{"mode": "counter", "edge": tc.edge, "debounce": "0s"}, p)
			for _, l := range seq {
				sendEdge(t, p, l)
			}
			eventuallyReads(t, d, tc.want)
			time.Sleep(20 * time.Millisecond)
			if got := readFirst(t, d); got != tc.want {
				t.Errorf("count = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("state falling", func(t *testing.T) {
		p := newFakePin(true)
		d := openGPIOInForTest(t, map[string]string{"edge": "falling", "debounce": "5ms"}, p)
		sendEdge(t, p, gpio.Low)
		if !fired(d, 2*time.Second) {
			t.Fatal("Changed did not fire on a falling edge")
		}
		// The rising edge still updates the state, but does not wake the
		// poller: the next poll picks it up.
		sendEdge(t, p, gpio.High)
		eventuallyReads(t, d, 0)
		if fired(d, 50*time.Millisecond) {
			t.Error("Changed fired on a rising edge")
		}
	})
}

func TestGPIOInChangedCoalesces(t *testing.T) {
	p := newFakePin(true)
	d := openGPIOInForTest(t, map[string]string{"mode": "counter", "debounce": "0s"}, p)
	if c := cap(d.Changed()); c != 1 {
		t.Fatalf("cap(Changed()) = %d, want 1", c)
	}
	for range 5 {
		sendEdge(t, p, gpio.Low)
		sendEdge(t, p, gpio.High)
	}
	eventuallyReads(t, d, 5)
	if !fired(d, 0) {
		t.Fatal("Changed did not fire")
	}
	if fired(d, 20*time.Millisecond) {
		t.Error("five pulses queued more than one wake-up")
	}
}

func TestGPIOInPullAndPolarity(t *testing.T) {
	t.Run("pull down is active high", func(t *testing.T) {
		p := newFakePin(true)
		d := openGPIOInForTest(t, map[string]string{"pull": "down"}, p)
		if pull := p.Pull(); pull != gpio.PullDown {
			t.Errorf("pull = %s, want down", pull)
		}
		if got := readFirst(t, d); got != 0 {
			t.Errorf("low line reads %v, want 0", got)
		}
		sendEdge(t, p, gpio.High)
		if !fired(d, 2*time.Second) || readFirst(t, d) != 1 {
			t.Error("high line does not read 1")
		}
	})
	t.Run("no pull, active low", func(t *testing.T) {
		p := newFakePin(true)
		p.l = gpio.Low // an external circuit holds the line low
		d := openGPIOInForTest(t, map[string]string{"pull": "none", "active_low": "true"}, p)
		if pull := p.Pull(); pull != gpio.Float {
			t.Errorf("pull = %s, want none (float)", pull)
		}
		if got := readFirst(t, d); got != 1 {
			t.Errorf("low line reads %v, want 1", got)
		}
	})
	t.Run("pull up, active high", func(t *testing.T) {
		p := newFakePin(true)
		d := openGPIOInForTest(t, map[string]string{"active_low": "false"}, p)
		if got := readFirst(t, d); got != 1 {
			t.Errorf("high line reads %v, want 1", got)
		}
	})
}

// openGPIOInQuiet opens a state input with the default options on pin,
// whose edge waits last at most quiet instead of gpioEdgeWait; it is
// closed when the test ends.
func openGPIOInQuiet(t *testing.T, pin gpio.PinIO, quiet time.Duration) *gpioIn {
	t.Helper()
	d, err := openGPIOIn(pin, "", gpioInOpts{edge: gpio.BothEdges, pull: gpio.PullUp, activeLow: true,
		debounce: 20 * time.Millisecond, quiet: quiet}, nil)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestGPIOInMissedEdge(t *testing.T) {
	t.Parallel()
	p := newFakePin(true)
	const quiet = 200 * time.Millisecond
	d := openGPIOInQuiet(t, p, quiet)
	// The line changes with no edge reported: the quiet line is read
	// again after the longest edge wait.
	if err := p.Out(gpio.Low); err != nil {
		t.Fatal(err)
	}
	if !fired(d, testkit.Scale(quiet+2*time.Second)) {
		t.Fatal("a change without an edge was never picked up")
	}
	if got := readFirst(t, d); got != 1 {
		t.Errorf("Read = %v, want 1", got)
	}
}

// closeWithin closes d and fails t if that takes longer than limit.
func closeWithin(t *testing.T, d Device, limit time.Duration) {
	t.Helper()
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > limit {
		t.Errorf("Close took %s, more than %s", took, limit)
	}
}

// goroutineGone fails t if something still takes edges from p.
func goroutineGone(t *testing.T, p *fakePin) {
	t.Helper()
	select {
	case p.edges <- gpio.Low:
		t.Error("an edge was taken after Close")
	case <-time.After(50 * time.Millisecond):
	}
}

// waitingForEdge returns once the device's goroutine waits on p.
func waitingForEdge(t *testing.T, p *fakePin) {
	t.Helper()
	testkit.WaitFor(t, 2*time.Second, "the device waiting for an edge", func() bool { return p.waiting.Load() > 0 })
}

func TestGPIOInClose(t *testing.T) {
	t.Run("halt interrupts the wait", func(t *testing.T) {
		p := newFakePin(true)
		d := openGPIOInForTest(t, nil, p)
		waitingForEdge(t, p)
		closeWithin(t, d, 200*time.Millisecond)
		if p.halts.Load() == 0 {
			t.Error("Close did not halt the pin")
		}
		goroutineGone(t, p)
		if err := d.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	t.Run("halt does nothing", func(t *testing.T) {
		t.Parallel()
		p := newFakePin(false)
		const quiet = 300 * time.Millisecond
		d := openGPIOInQuiet(t, p, quiet)
		waitingForEdge(t, p)
		closeWithin(t, d, quiet+500*time.Millisecond)
		goroutineGone(t, p)
	})
	t.Run("during a long debounce", func(t *testing.T) {
		p := newFakePin(true)
		d := openGPIOInForTest(t, map[string]string{"debounce": "10s"}, p)
		sendEdge(t, p, gpio.Low)
		closeWithin(t, d, 200*time.Millisecond)
	})
}

func TestGPIOInOpenFailures(t *testing.T) {
	_, open := parseSensorYAML(t, gpioInYAML, nil)
	p := newFakePin(true)
	p.inErr = errors.New("line busy")
	p.edgeErr = errors.New("edge detection not supported")
	_, err := open(Conn{Pin: p})
	if err == nil || !strings.Contains(err.Error(), "gpio_in GPIO17") || !strings.Contains(err.Error(), "line busy") ||
		!strings.Contains(err.Error(), "edge detection not supported") {
		t.Errorf("open = %v; want an error naming the pin and both refusals", err)
	}
	if _, err := open(Conn{}); err == nil {
		t.Error("open without a pin succeeded")
	}
}

// A line that refuses edge detection but reads is polled once every
// gpioPollEvery, which the log says, with the debounce still applied.
func TestGPIOInPollsLineWithoutEdges(t *testing.T) {
	t.Parallel()
	p := newFakePin(true)
	p.edgeErr = errors.New("edge detection not supported")
	var log testkit.Buffer
	start := time.Now()
	d := openGPIOInLogged(t, nil, p, &log)
	if out := log.String(); strings.Count(out, "cannot wait for edges") != 1 || !strings.Contains(out, "gpio_in GPIO17") ||
		!strings.Contains(out, "edge detection not supported") {
		t.Errorf("log %q; want one line naming the pin, that it is polled, and why", out)
	}
	// The line closes with no edge to tell: a poll picks it up.
	if err := p.Out(gpio.Low); err != nil {
		t.Fatal(err)
	}
	if !fired(d, testkit.Scale(gpioPollEvery+2*time.Second)) {
		t.Fatal("the polled line's change was never picked up")
	}
	if got := readFirst(t, d); got != 1 {
		t.Errorf("Read = %v, want 1", got)
	}
	// Reads: one at open, two for the change (before and after the
	// debounce), then one per poll.
	testkit.WaitFor(t, 4*gpioPollEvery, "two more polls", func() bool { return p.reads.Load() >= 5 })
	if polls, took := p.reads.Load()-2, time.Since(start); took < time.Duration(polls-1)*gpioPollEvery {
		t.Errorf("%d polls in %s: more often than every %s", polls, took, gpioPollEvery)
	}
	if n := p.waits.Load(); n != 0 {
		t.Errorf("WaitForEdge called %d times on a line without edge detection", n)
	}
	closeWithin(t, d, 200*time.Millisecond)
}

// A pin whose edge wait returns at once is not spun on: it is read once
// per gpioPollEvery, and the log says so once.
func TestGPIOInPinThatCannotWait(t *testing.T) {
	t.Parallel()
	p := newFakePin(true)
	p.noWait = true
	var log testkit.Buffer
	start := time.Now()
	d := openGPIOInLogged(t, nil, p, &log)
	testkit.WaitFor(t, 4*gpioPollEvery, "three edge waits", func() bool { return p.waits.Load() >= 3 })
	if took := time.Since(start); took < 2*gpioPollEvery {
		t.Errorf("three edge waits in %s: the goroutine spins on a pin that cannot wait", took)
	}
	if out := log.String(); strings.Count(out, "cannot wait for edges") != 1 || !strings.Contains(out, "returns at once") {
		t.Errorf("log %q; want one line saying the edge wait returns at once", out)
	}
	if err := p.Out(gpio.Low); err != nil {
		t.Fatal(err)
	}
	if !fired(d, testkit.Scale(gpioPollEvery+2*time.Second)) {
		t.Fatal("the line's change was never picked up")
	}
	closeWithin(t, d, 200*time.Millisecond)
}

func TestGPIOInParse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		edit       func(*Sensor)
		path, want string
	}{
		{"mode", withOptions(map[string]string{"mode": "toggle"}),
			"sensors[0].options.mode", `"toggle" is not allowed; use one of state, counter`},
		{"edge", withOptions(map[string]string{"edge": "up"}),
			"sensors[0].options.edge", `"up" is not allowed; use one of rising, falling, both`},
		{"pull", withOptions(map[string]string{"pull": "sideways"}),
			"sensors[0].options.pull", `"sideways" is not allowed; use one of up, down, none`},
		{"active_low", withOptions(map[string]string{"active_low": "maybe"}),
			"sensors[0].options.active_low", `"maybe" is not allowed; use true or false`},
		{"debounce too long", withOptions(map[string]string{"debounce": "20s"}),
			"sensors[0].options.debounce", `"20s" is not allowed; use a duration from 0s to 10s, such as 20ms`},
		{"debounce negative", withOptions(map[string]string{"debounce": "-1ms"}),
			"sensors[0].options.debounce", "use a duration from 0s to 10s"},
		{"debounce no unit", withOptions(map[string]string{"debounce": "20"}),
			"sensors[0].options.debounce", "use a duration from 0s to 10s"},
		{"unknown option", withOptions(map[string]string{"invert": "true"}),
			"sensors[0].options.invert", "unknown option for gpio_in; known options: active_low, debounce, edge, mode, pull"},
		{"bus", func(sc *Sensor) { sc.Bus = "1" },
			"sensors[0].bus", `"1" is not allowed for gpio_in; use gpio`},
		{"address", func(sc *Sensor) { sc.Address = "" },
			"sensors[0].address", "required: the pin name, such as GPIO17"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, _ := parseSensorYAML(t, gpioInYAML, tc.edit)
			wantProblem(t, ps, tc.path, tc.want)
		})
	}

	// Every problem at once, not the first.
	ps, _ := parseSensorYAML(t, gpioInYAML, withOptions(map[string]string{"mode": "x", "edge": "y", "debounce": "z"}))
	if len(ps) != 3 {
		t.Errorf("problems = %+v; want three", ps)
	}
}

func TestGPIOInReadAllocs(t *testing.T) {
	for _, mode := range []string{"state", "counter"} {
		p := newFakePin(true)
		d := openGPIOInForTest(t, map[string]string{"mode": mode}, p)
		ctx := context.Background()
		vals := []float64{0}
		if allocs := testing.AllocsPerRun(1000, func() { _ = d.Read(ctx, vals) }); allocs != 0 {
			t.Errorf("%s: Read allocates %.1f times; want 0", mode, allocs)
		}
	}
}

// TestGPIOInOnSimulatedPin follows the simulated door contact, whose
// schedule stands still on a clock that does not move.
func TestGPIOInOnSimulatedPin(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	w := sim.New(3, sim.WithClock(func() time.Time { return at }))
	pin, err := (&Buses{Sim: w}).Pin(SimBus, sim.PinDoor)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(gpioInYAML, "bus: gpio, address: GPIO17", "bus: sim, address: "+sim.PinDoor, 1)
	ps, open := parseSensorYAML(t, doc, withOptions(map[string]string{"debounce": "5ms"}))
	if len(ps) > 0 {
		t.Fatalf("problems: %+v", ps)
	}
	dev, err := open(Conn{Pin: pin})
	if err != nil {
		t.Fatal(err)
	}
	d := dev.(*gpioIn)
	before := readFirst(t, d)
	if err := w.Toggle(sim.PinDoor); err != nil {
		t.Fatal(err)
	}
	if !fired(d, 2*time.Second) {
		t.Fatal("Changed did not fire on a toggle")
	}
	if got := readFirst(t, d); got != 1-before {
		t.Errorf("after a toggle Read = %v, want %v", got, 1-before)
	}
	closeWithin(t, d, 200*time.Millisecond)
}

func BenchmarkGPIOInRead(b *testing.B) {
	d, err := openGPIOIn(newFakePin(true), "GPIO17", gpioInOpts{counter: true, edge: gpio.FallingEdge, pull: gpio.PullUp, activeLow: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	benchmarkRead(b, d)
}

// haltable is a gpiotest.Pin whose Halt ends a wait in progress, as the
// GPIO character device's does, by handing it the line's own level: an
// edge that changes nothing. gpiotest's own Halt does nothing, and Close
// would wait out gpioEdgeWait.
type haltable struct{ *gpiotest.Pin }

// Halt ends the wait in progress, if there is one.
func (p haltable) Halt() error {
	select {
	case p.EdgesChan <- p.Read():
	default:
	}
	return nil
}

// TestGPIOInOnPeriphTestPin drives the driver through periph's own
// gpiotest.Pin, whose edges arrive on EdgesChan carrying the new level: a
// door contact in state mode and a meter in counter mode.
func TestGPIOInOnPeriphTestPin(t *testing.T) {
	door := &gpiotest.Pin{N: "GPIO5", Num: 5, EdgesChan: make(chan gpio.Level)}
	d := openGPIOInForTest(t, map[string]string{"debounce": "5ms"}, haltable{door})
	send := func(p *gpiotest.Pin, l gpio.Level) {
		t.Helper()
		select {
		case p.EdgesChan <- l:
		case <-time.After(testkit.Scale(2 * time.Second)):
			t.Fatalf("the device did not take the edge to %s", l)
		}
	}
	// Pull-up and active low: the line rests high (contact open, 0); a
	// closed contact pulls it low and reads 1.
	if got := readFirst(t, d); got != 0 {
		t.Fatalf("state at rest = %v, want 0", got)
	}
	send(door, gpio.Low)
	if !fired(d, 2*time.Second) {
		t.Fatal("Changed did not fire for the closed contact")
	}
	eventuallyReads(t, d, 1)
	send(door, gpio.High)
	eventuallyReads(t, d, 0)

	meter := &gpiotest.Pin{N: "GPIO6", Num: 6, EdgesChan: make(chan gpio.Level)}
	m := openGPIOInForTest(t, map[string]string{"mode": "counter", "debounce": "0s"}, haltable{meter})
	for range 7 {
		send(meter, gpio.Low)
		send(meter, gpio.High)
	}
	eventuallyReads(t, m, 7)
}

// countingPin counts the edge waits a device makes on a pin and keeps the
// shortest timeout it asked for.
type countingPin struct {
	gpio.PinIO
	waits    atomic.Int32
	shortest atomic.Int64 // nanoseconds; 0 before the first wait
}

// WaitForEdge counts the call and waits on the pin.
func (p *countingPin) WaitForEdge(timeout time.Duration) bool {
	p.waits.Add(1)
	for {
		old := p.shortest.Load()
		if (old != 0 && old <= int64(timeout)) || p.shortest.CompareAndSwap(old, int64(timeout)) {
			break
		}
	}
	return p.PinIO.WaitForEdge(timeout)
}

// TestGPIOInQuietLineSleeps follows a line without edges, simulated and
// periph's gpiotest.Pin: the device makes one edge wait after another,
// each as long as it may be, and on the simulated line the pin wakes for
// nothing in between. The waits here last 300 ms so that the test is
// quick; gpioEdgeWait, at least a second, is what a gateway runs with.
func TestGPIOInQuietLineSleeps(t *testing.T) {
	if gpioEdgeWait < time.Second || gpioPollEvery < time.Second {
		t.Fatalf("gpioEdgeWait %s, gpioPollEvery %s: an idle input must wake no more than once a second", gpioEdgeWait, gpioPollEvery)
	}
	const quiet = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		pin  func(t *testing.T) (gpio.PinIO, func() uint64)
	}{
		{"sim", func(t *testing.T) (gpio.PinIO, func() uint64) {
			// The system clock: the door's first flip is 20 to 90 s away.
			w := sim.New(11)
			pin, err := w.Pin(sim.PinDoor)
			if err != nil {
				t.Fatal(err)
			}
			return pin, w.Wakeups
		}},
		{"gpiotest", func(*testing.T) (gpio.PinIO, func() uint64) {
			return &gpiotest.Pin{N: "GPIO5", Num: 5, EdgesChan: make(chan gpio.Level)}, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pin, wakeups := tc.pin(t)
			p := &countingPin{PinIO: pin}
			start := time.Now()
			d := openGPIOInQuiet(t, p, quiet)
			testkit.WaitFor(t, 10*quiet, "three edge waits", func() bool { return p.waits.Load() >= 3 })
			waits, took := p.waits.Load(), time.Since(start)
			if took < time.Duration(waits-1)*quiet {
				t.Errorf("%d edge waits in %s on a quiet line: more than one per %s", waits, took, quiet)
			}
			if s := time.Duration(p.shortest.Load()); s != quiet {
				t.Errorf("an edge wait of %s on a quiet line; want %s", s, quiet)
			}
			if wakeups != nil {
				// Each wait looks at the line when it starts and when it ends.
				if n := wakeups(); n > 2*uint64(waits) {
					t.Errorf("the simulated line woke %d times in %d edge waits; want at most 2 per wait", n, waits)
				}
			}
			if fired(d, 0) {
				t.Error("Changed fired on a quiet line")
			}
		})
	}
}
