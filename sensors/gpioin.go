package sensors

// A digital input on a GPIO pin: a door contact's state, or the pulses of
// a meter's S0 output counted.
//
// The device owns a goroutine that waits for edges on the pin and
// debounces them: after an edge it waits the debounce time, taking in any
// further edges of the bounce, then reads the line and accepts the level
// only if it differs from the last one accepted. An accepted change
// updates the state, or counts a pulse when it is in the chosen direction,
// and wakes the poller through Changed. Read reports what the goroutine
// last accepted and touches no hardware.
//
// While the line is quiet the goroutine sleeps in the kernel's (or the
// simulator's) edge wait, waking once every gpioEdgeWait to read the line.
// A line that cannot report edges (In refuses edge detection, or its edge
// wait returns at once) is read every gpioPollEvery instead, which is said
// once in the log: changes shorter than that are missed there.
//
// The pin always reports both edges, whatever the edge option says: a
// falling-only interrupt would hide the line's return to high, and the
// next falling edge would then look like no change at all. The edge
// option filters accepted changes instead. It names the line's electrical
// direction, before active_low: with the default pull-up, a contact that
// closes to ground makes a falling edge.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"periph.io/x/conn/v3/gpio"
)

// gpioInKind is the kind this file drives, listed in the table in kinds.go.
var gpioInKind = Kind{
	Name:  "gpio_in",
	Doc:   "digital input on a GPIO pin: a contact's state, or a pulse count",
	Bus:   BusGPIO,
	Parse: parseGPIOIn,
}

// gpioEdgeWait bounds each wait for an edge: a line that has been quiet
// this long is read, to pick up a change whose edge was lost (the kernel
// keeps a line's events until they are read, so that takes an overflow of
// its queue). Half a minute costs an idle gateway nothing worth counting
// (each wake-up of a quiet input cost it 0.025 % of a core at 1 s on the
// benchmark machine) and corrects a lost change sooner than a door's
// reading interval would show it. It also bounds Close on a pin whose Halt
// cannot interrupt a wait; the character device's and the simulated
// lines' can.
const gpioEdgeWait = 30 * time.Second

// gpioPollEvery is how often a line that cannot report edges is read:
// the shortest period an idle gateway may wake for (nothing ticks faster
// than once a second at rest), and still prompt for a door's state. An S0
// meter's pulses (30 to 100 ms) are missed on such a line.
const gpioPollEvery = time.Second

// gpioInOpts are a gpio_in's parsed options.
type gpioInOpts struct {
	counter   bool
	edge      gpio.Edge // which accepted changes count or wake the poller
	pull      gpio.Pull
	activeLow bool
	debounce  time.Duration
	quiet     time.Duration // the longest edge wait; gpioEdgeWait when zero (tests set it shorter)
}

// The values of options edge and pull.
var (
	gpioEdges = map[string]gpio.Edge{"rising": gpio.RisingEdge, "falling": gpio.FallingEdge, "both": gpio.BothEdges}
	gpioPulls = map[string]gpio.Pull{"up": gpio.PullUp, "down": gpio.PullDown, "none": gpio.Float}
)

func parseGPIOIn(s *Spec) Opener {
	var o gpioInOpts
	mode := s.Choice("mode", "state", "state", "counter")
	o.counter = mode == "counter"
	// A state wants to hear of both changes; a meter's pulse is one
	// closing of its contact.
	edge := "both"
	if o.counter {
		edge = "falling"
	}
	o.edge = gpioEdges[s.Choice("edge", edge, "rising", "falling", "both")]
	pull := s.Choice("pull", "up", "up", "down", "none")
	o.pull = gpioPulls[pull]
	// With a pull-up the usual wiring is a contact to ground: closed pulls
	// the line low and should read 1.
	o.activeLow = s.Bool("active_low", pull == "up")
	// 20 ms outlasts the bounce of common reed and micro switches and is
	// shorter than any pulse an S0 meter output gives (at least 30 ms).
	o.debounce = s.Duration("debounce", 20*time.Millisecond, 0, 10*time.Second)
	name := s.Address
	return func(c Conn) (Device, error) { return openGPIOIn(c.Pin, name, o, c.Log) }
}

// gpioIn is one opened input.
type gpioIn struct {
	pin    gpio.PinIO
	opts   gpioInOpts
	name   string
	qs     []Quantity
	log    *slog.Logger
	polled bool // the pin refused edge detection: the line is read every gpioPollEvery

	state   atomic.Bool   // the accepted level, after active_low
	count   atomic.Uint64 // accepted changes in the chosen direction
	changed chan struct{}

	line gpio.Level // the accepted line level; the goroutine's own

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func openGPIOIn(pin gpio.PinIO, name string, o gpioInOpts, log *slog.Logger) (*gpioIn, error) {
	if name == "" && pin != nil {
		name = pin.Name()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &gpioIn{
		pin:     pin,
		opts:    o,
		log:     log,
		changed: make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	mode := "state"
	if o.counter {
		mode = "counter"
		d.qs = []Quantity{{Name: "count", Max: 1e15, Total: true}}
	} else {
		d.qs = []Quantity{{Name: "state", Max: 1, Binary: true}}
	}
	d.name = fmt.Sprintf("gpio_in %s (%s, %s)", name, mode, edgeName(o.edge))
	if pin == nil {
		return nil, fmt.Errorf("sensors: %s: no GPIO pin to open it on", d.name)
	}
	if err := pin.In(o.pull, gpio.BothEdges); err != nil {
		// A line without edge detection (a GPIO expander's, or one whose
		// interrupt is taken) can still be read.
		if err2 := pin.In(o.pull, gpio.NoEdge); err2 != nil {
			return nil, fmt.Errorf("sensors: %s: set up as an input with %s: %w (with edge detection: %v)", d.name, o.pull, err2, err)
		}
		d.polled = true
		d.pollingLog("the line refuses edge detection", err)
	}
	d.line = pin.Read()
	d.state.Store(bool(d.line) != o.activeLow)
	go d.watch()
	return d, nil
}

// pollingLog says, once per device, that the line is polled and why.
func (d *gpioIn) pollingLog(why string, err error) {
	args := []any{"device", d.name, "why", why, "every", gpioPollEvery.String()}
	if err != nil {
		args = append(args, "err", err)
	}
	d.log.Warn("GPIO input cannot wait for edges; reading it at intervals instead, so shorter changes are missed", args...)
}

func edgeName(e gpio.Edge) string {
	for name, v := range gpioEdges {
		if v == e {
			return name
		}
	}
	return "both"
}

// watch is the goroutine that follows the pin until Close.
func (d *gpioIn) watch() {
	defer close(d.done)
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	defer pause.Stop()
	if d.polled {
		for !d.stopping() {
			d.sleepUntil(pause, time.Now().Add(gpioPollEvery))
			d.readSettled(pause)
		}
		return
	}
	quiet := cmp.Or(d.opts.quiet, gpioEdgeWait)
	logged := false
	for !d.stopping() {
		start := time.Now()
		if !d.pin.WaitForEdge(quiet) {
			if d.stopping() {
				break
			}
			if time.Since(start) < quiet/2 {
				// A pin that cannot wait returns at once: rather than
				// spin on it, the goroutine polls the line.
				if !logged {
					logged = true
					d.pollingLog("its edge wait returns at once", nil)
				}
				d.sleepUntil(pause, start.Add(gpioPollEvery))
			}
			// A quiet line is read too, for a change whose edge was lost.
			d.readSettled(pause)
			continue
		}
		deadline := time.Now().Add(d.opts.debounce)
		for !d.stopping() {
			wait := min(time.Until(deadline), quiet)
			if wait <= 0 {
				break
			}
			// Further edges before the deadline are bounce: take them in
			// so that they are not seen as new edges afterwards.
			if !d.pin.WaitForEdge(wait) {
				d.sleepUntil(pause, deadline)
				break
			}
		}
		if !d.stopping() {
			d.accept(d.pin.Read())
		}
	}
}

// readSettled reads the line without an edge to go by, and accepts a new
// level only if the line still shows it after the debounce time: a read
// in the middle of a bounce is no change.
func (d *gpioIn) readSettled(pause *time.Timer) {
	if d.stopping() {
		return
	}
	level := d.pin.Read()
	if level != d.line && d.opts.debounce > 0 {
		d.sleepUntil(pause, time.Now().Add(d.opts.debounce))
		if d.stopping() || d.pin.Read() != level {
			return
		}
	}
	d.accept(level)
}

// sleepUntil waits on t until deadline or Close.
func (d *gpioIn) sleepUntil(t *time.Timer, deadline time.Time) {
	wait := time.Until(deadline)
	if wait <= 0 {
		return
	}
	t.Reset(wait)
	select {
	case <-t.C:
	case <-d.stop:
		t.Stop()
	}
}

func (d *gpioIn) stopping() bool {
	select {
	case <-d.stop:
		return true
	default:
		return false
	}
}

// accept takes level as the line's debounced level.
func (d *gpioIn) accept(level gpio.Level) {
	if level == d.line {
		return
	}
	d.line = level
	d.state.Store(bool(level) != d.opts.activeLow)
	rising := level == gpio.High
	switch d.opts.edge {
	case gpio.RisingEdge:
		if !rising {
			return
		}
	case gpio.FallingEdge:
		if rising {
			return
		}
	}
	if d.opts.counter {
		d.count.Add(1)
	}
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// Quantities reports the state or the count.
func (d *gpioIn) Quantities() []Quantity { return d.qs }

// Read reports the debounced state, or the pulses counted since open.
func (d *gpioIn) Read(_ context.Context, vals []float64) error {
	switch {
	case d.opts.counter:
		vals[0] = float64(d.count.Load())
	case d.state.Load():
		vals[0] = 1
	default:
		vals[0] = 0
	}
	return nil
}

// Changed receives when the state has changed, or a pulse was counted,
// since the last receive.
func (d *gpioIn) Changed() <-chan struct{} { return d.changed }

// Close halts the pin and stops the goroutine, waiting for it.
func (d *gpioIn) Close() error {
	var err error
	d.closeOnce.Do(func() {
		close(d.stop)
		err = d.pin.Halt()
		// Halt interrupts only a wait already under way; one that began
		// just after is interrupted by the next Halt, and on a pin whose
		// Halt interrupts nothing it ends after gpioEdgeWait.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-d.done:
				return
			case <-tick.C:
				_ = d.pin.Halt()
			}
		}
	})
	if err != nil {
		return fmt.Errorf("sensors: %s: halt: %w", d.name, err)
	}
	return nil
}

// String names the pin, the mode and the edge.
func (d *gpioIn) String() string { return d.name }
