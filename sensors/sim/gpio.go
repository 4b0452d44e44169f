package sim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/conn/v3/pin"
)

// Pin behaviour.
const (
	// meterPulse is how long the water meter's contact closes per pulse.
	meterPulse = 50 * time.Millisecond
	// edgeQueue is how many undelivered edges a pin keeps, dropping the
	// oldest beyond it, like the kernel's GPIO character device.
	edgeQueue = 16
	// edgePoll bounds how long WaitForEdge sleeps before it looks at an
	// injected clock again, which can jump at any time: short beside any
	// test's timeout. On the system clock a wait sleeps until the next
	// event instead, so that an idle gateway does not wake for it.
	edgePoll = 10 * time.Millisecond
	// scheduleHorizon is the longest jump of the world's clock that a
	// pin's schedule plays through event by event; after a longer one it
	// starts again at the new time.
	scheduleHorizon = 7 * 24 * time.Hour
)

// simPin is one simulated GPIO line: an input driven by the world on a
// schedule (the door and the meter) or a free line used as an output.
//
// WaitForEdge follows gpio.PinIn's documentation: a negative timeout
// waits for ever, zero only looks for an edge already queued. Note that
// periph's gpioioctl, which drives the real board, differs: it treats 0 as
// no timeout and a negative timeout as already expired. A driver that
// passes a positive timeout behaves the same on both.
type simPin struct {
	w      *World
	name   string
	number int
	signal string    // what drives an input, for errors; empty for an output line
	sched  *schedule // nil for an output line

	mu      sync.Mutex
	output  bool // driving its level
	level   gpio.Level
	pull    gpio.Pull
	edge    gpio.Edge
	pending int           // edges detected and not yet returned by WaitForEdge
	gen     uint64        // bumped by In and Halt, which end every wait
	wake    chan struct{} // closed, and replaced, when waiters must look again
}

// schedule is when a driven input changes next.
type schedule struct {
	rng       *rand.Rand
	at        time.Time  // the next event
	set       gpio.Level // the level it sets
	flip      bool       // the event flips the level instead (the door)
	lastPulse time.Time  // the meter's last rising edge
}

func newPins(w *World) []*simPin {
	pins := []*simPin{
		{name: PinDoor, signal: "the simulated door contact"},
		{name: PinMeter, signal: "the simulated water meter"},
		{name: PinOut0}, {name: PinOut1}, {name: PinOut2}, {name: PinOut3},
	}
	for i, p := range pins {
		p.w, p.number, p.pull, p.wake = w, i, gpio.Float, make(chan struct{})
		if p.signal == "" {
			continue
		}
		p.sched = &schedule{rng: rand.New(rand.NewPCG(w.seed, mix(uint64(i)+0x5eed)))}
		p.sched.start(w.origin, p.name == PinDoor)
	}
	return pins
}

// start plans the first event after t.
func (s *schedule) start(t time.Time, door bool) {
	s.flip = door
	if door {
		s.at = t.Add(s.between(20*time.Second, 90*time.Second))
		return
	}
	s.set = gpio.High
	s.lastPulse = t
	s.at = t.Add(s.between(time.Second, 5*time.Second))
}

// advance plans the event after the one at s.at.
func (s *schedule) advance() {
	switch {
	case s.flip:
		s.at = s.at.Add(s.between(20*time.Second, 90*time.Second))
	case s.set == gpio.High: // a pulse began: it ends
		s.lastPulse = s.at
		s.at = s.at.Add(meterPulse)
		s.set = gpio.Low
	default: // a pulse ended: the next begins 1 to 5 s after this one began
		s.at = s.lastPulse.Add(s.between(time.Second, 5*time.Second))
		s.set = gpio.High
	}
}

func (s *schedule) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)))
}

// catchUp plays the schedule's events up to now. The caller holds p.mu.
func (p *simPin) catchUp(now time.Time) {
	s := p.sched
	if s == nil {
		return
	}
	if now.Sub(s.at) > scheduleHorizon {
		s.start(now, s.flip)
		return
	}
	for !s.at.After(now) {
		l := s.set
		if s.flip {
			l = !p.level
		}
		p.setLevel(l)
		s.advance()
	}
}

// setLevel changes the line's level, queueing the edge if In asked for
// it. The caller holds p.mu.
func (p *simPin) setLevel(l gpio.Level) {
	if l == p.level {
		return
	}
	p.level = l
	if p.output {
		return
	}
	if detects(p.edge, l) {
		p.pending = min(p.pending+1, edgeQueue)
		p.notify()
	}
}

// detects reports whether edge detection e reports a change to level l.
func detects(e gpio.Edge, l gpio.Level) bool {
	switch e {
	case gpio.BothEdges:
		return true
	case gpio.RisingEdge:
		return l == gpio.High
	case gpio.FallingEdge:
		return l == gpio.Low
	}
	return false
}

// notify wakes every waiter to look again. The caller holds p.mu.
func (p *simPin) notify() {
	close(p.wake)
	p.wake = make(chan struct{})
}

func (p *simPin) toggle() error {
	if p.sched == nil {
		return fmt.Errorf("sim: %s is an output line; Toggle moves the inputs %s and %s", p.name, PinDoor, PinMeter)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.catchUp(p.w.now())
	p.setLevel(!p.level)
	return nil
}

// String returns the pin's name.
func (p *simPin) String() string { return p.name }

// Name returns the pin's name.
func (p *simPin) Name() string { return p.name }

// Number returns the pin's index among the simulated pins.
func (p *simPin) Number() int { return p.number }

// Function returns Func as a string.
func (p *simPin) Function() string { return string(p.Func()) }

// Func returns the pin's direction and level, as periph's board drivers do.
func (p *simPin) Func() pin.Func {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.catchUp(p.w.now())
	switch {
	case p.output && p.level == gpio.High:
		return gpio.OUT_HIGH
	case p.output:
		return gpio.OUT_LOW
	case p.level == gpio.High:
		return gpio.IN_HIGH
	}
	return gpio.IN_LOW
}

// SupportedFuncs lists IN, and OUT for an output line.
func (p *simPin) SupportedFuncs() []pin.Func {
	if p.sched != nil {
		return []pin.Func{gpio.IN}
	}
	return []pin.Func{gpio.IN, gpio.OUT}
}

// SetFunc makes the pin an input (IN) or an output (OUT, OUT_LOW, OUT_HIGH).
func (p *simPin) SetFunc(f pin.Func) error {
	switch f {
	case gpio.IN:
		return p.In(gpio.PullNoChange, gpio.NoEdge)
	case gpio.OUT, gpio.OUT_LOW:
		return p.Out(gpio.Low)
	case gpio.OUT_HIGH:
		return p.Out(gpio.High)
	}
	return fmt.Errorf("sim: %s: function %q is not simulated; use IN or OUT", p.name, f)
}

// Halt ends any WaitForEdge in progress, which returns false.
func (p *simPin) Halt() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.notify()
	return nil
}

// In makes the pin an input with pull and edge detection, dropping
// queued edges and ending any wait in progress. An output line stops
// driving and reads its pull; a driven input reads its signal whatever
// the pull.
func (p *simPin) In(pull gpio.Pull, edge gpio.Edge) error {
	if edge < gpio.NoEdge || edge > gpio.BothEdges {
		return fmt.Errorf("sim: %s: edge %d is not one of NoEdge, RisingEdge, FallingEdge, BothEdges", p.name, edge)
	}
	if pull > gpio.PullUp {
		return fmt.Errorf("sim: %s: pull %d is not one of Float, PullDown, PullUp, PullNoChange", p.name, pull)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.catchUp(p.w.now())
	if pull != gpio.PullNoChange {
		p.pull = pull
	}
	if p.sched == nil {
		p.output = false
		p.level = gpio.Level(p.pull == gpio.PullUp)
	}
	p.edge = edge
	p.pending = 0
	p.gen++
	p.notify()
	return nil
}

// Read returns the level on the line.
func (p *simPin) Read() gpio.Level {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.catchUp(p.w.now())
	return p.level
}

// WaitForEdge returns true for an edge of the kind In asked for, queued or
// arriving within timeout (negative: no limit), and false when the time is
// up, when Halt or In is called meanwhile, or when In asked for no edges.
// It sleeps until the time is up, an edge comes (Toggle) or the pin's
// schedule has its next event; only on an injected clock does it also
// wake every edgePoll to look at the clock.
func (p *simPin) WaitForEdge(timeout time.Duration) bool {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	look := time.NewTimer(time.Hour)
	look.Stop()
	defer look.Stop()

	p.mu.Lock()
	defer p.mu.Unlock()
	gen := p.gen
	for last := timeout == 0; ; {
		now := p.w.now()
		p.catchUp(now)
		p.w.wakeups.Add(1)
		switch {
		case p.gen != gen || p.output || p.edge == gpio.NoEdge:
			return false
		case p.pending > 0:
			p.pending--
			return true
		case last:
			return false
		}
		var due <-chan time.Time
		if d, ok := p.lookAgain(now); ok {
			look.Reset(d)
			due = look.C
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-expired:
			last = true
		case <-wake:
		case <-due:
		}
		p.mu.Lock()
	}
}

// lookAgain returns how long a wait may sleep before it must look at the
// clock again: until the schedule's next event on the system clock, whose
// readings carry the monotonic time the schedule is kept in; at most
// edgePoll on an injected clock. ok is false for a line nothing drives on
// the system clock: only Toggle, In or Halt change it, and they wake the
// wait. The caller holds p.mu.
func (p *simPin) lookAgain(now time.Time) (d time.Duration, ok bool) {
	if p.w.clocked {
		d = edgePoll
		if p.sched != nil {
			if next := p.sched.at.Sub(now); next > 0 && next < d {
				d = next
			}
		}
		return d, true
	}
	if p.sched == nil {
		return 0, false
	}
	// catchUp leaves the next event after now.
	return max(p.sched.at.Sub(now), 0), true
}

// Pull returns the pull In set.
func (p *simPin) Pull() gpio.Pull {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pull
}

// DefaultPull returns Float: the simulated lines have no pull at reset.
func (p *simPin) DefaultPull() gpio.Pull { return gpio.Float }

// Out drives an output line to l. An input the world drives refuses.
func (p *simPin) Out(l gpio.Level) error {
	if p.sched != nil {
		return fmt.Errorf("sim: %s is driven by %s and cannot be an output; the outputs are %s to %s", p.name, p.signal, PinOut0, PinOut3)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.output {
		p.output = true
		p.gen++
		p.notify()
	}
	p.level = l
	return nil
}

// PWM fails: the simulated lines only switch.
func (p *simPin) PWM(gpio.Duty, physic.Frequency) error {
	return fmt.Errorf("sim: %s: PWM is not simulated; use Out", p.name)
}

var (
	_ gpio.PinIO  = (*simPin)(nil)
	_ pin.PinFunc = (*simPin)(nil)
)
