package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/pin"
)

func mustPin(t *testing.T, w *World, name string) gpio.PinIO {
	t.Helper()
	p, err := w.Pin(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSimPinNames(t *testing.T) {
	w, _ := newTestWorld(t, 1)
	_, err := w.Pin("GPIO17")
	if err == nil {
		t.Fatal("an unknown pin was found")
	}
	for _, n := range []string{"GPIO17", PinDoor, PinMeter, PinOut0, PinOut3} {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %s", err, n)
		}
	}
	if a, b := mustPin(t, w, PinOut1), mustPin(t, w, PinOut1); a != b {
		t.Error("two calls return two different pins")
	}
	if _, err := w.Level("nope"); err == nil {
		t.Error("Level of an unknown pin succeeded")
	}
}

// TestSimDoorToggles steps the clock a second at a time over two hours
// and expects the door to flip every 20 to 90 s, each flip reported once
// by WaitForEdge.
func TestSimDoorToggles(t *testing.T) {
	w, clk := newTestWorld(t, 2)
	door := mustPin(t, w, PinDoor)
	if err := door.In(gpio.PullUp, gpio.BothEdges); err != nil {
		t.Fatal(err)
	}
	if door.WaitForEdge(0) {
		t.Fatal("an edge before the clock moved")
	}
	level := door.Read()
	last := w.Now()
	flips := 0
	for range 7200 {
		clk.Add(time.Second)
		got := door.Read()
		edge := door.WaitForEdge(0)
		if (got != level) != edge {
			t.Fatalf("%s: level %v→%v but WaitForEdge %v", w.Now(), level, got, edge)
		}
		if got == level {
			continue
		}
		gap := w.Now().Sub(last)
		if flips > 0 && (gap < 20*time.Second || gap > 91*time.Second) {
			t.Errorf("door flipped after %s, want 20 to 90 s", gap)
		}
		if flips == 0 && gap > 91*time.Second {
			t.Errorf("first flip after %s", gap)
		}
		level, last = got, w.Now()
		flips++
		if l, _ := w.Level(PinDoor); l != got {
			t.Errorf("Level says %v, Read %v", l, got)
		}
	}
	if flips < 7200/90 || flips > 7200/20 {
		t.Errorf("%d flips in two hours, want %d to %d", flips, 7200/90, 7200/20)
	}
}

// TestSimMeterPulses counts the water meter's rising edges over ten
// minutes: one pulse every 1 to 5 s.
func TestSimMeterPulses(t *testing.T) {
	w, clk := newTestWorld(t, 3)
	meter := mustPin(t, w, PinMeter)
	if err := meter.In(gpio.Float, gpio.RisingEdge); err != nil {
		t.Fatal(err)
	}
	pulses, highs := 0, 0
	for range 60000 {
		clk.Add(10 * time.Millisecond)
		if meter.Read() == gpio.High {
			highs++
		}
		for meter.WaitForEdge(0) {
			pulses++
		}
	}
	if pulses < 600/5 || pulses > 600 {
		t.Errorf("%d pulses in 10 minutes, want %d to %d", pulses, 600/5, 600)
	}
	// Each pulse is 50 ms high: five samples.
	if highs != 5*pulses {
		t.Errorf("%d samples high for %d pulses, want 5 each", highs, pulses)
	}
}

func TestSimWaitForEdge(t *testing.T) {
	w, clk := newTestWorld(t, 4)
	door := mustPin(t, w, PinDoor)
	if err := door.In(gpio.PullUp, gpio.BothEdges); err != nil {
		t.Fatal(err)
	}

	// The clock stands still: the timeout ends the wait.
	done := make(chan bool, 1)
	start := time.Now()
	go func() { done <- door.WaitForEdge(60 * time.Millisecond) }()
	select {
	case got := <-done:
		if got {
			t.Fatal("an edge with the clock stopped")
		}
		if el := time.Since(start); el < 60*time.Millisecond {
			t.Errorf("WaitForEdge(60ms) returned after %s", el)
		}
	case <-time.After(testkit.Scale(2 * time.Second)):
		t.Fatalf("WaitForEdge(60ms) still waiting after %v", testkit.Scale(2*time.Second))
	}

	// The clock jumps while waiting: the edge ends the wait.
	go func() { done <- door.WaitForEdge(5 * time.Second) }()
	time.Sleep(20 * time.Millisecond)
	clk.Add(91 * time.Second)
	select {
	case got := <-done:
		if !got {
			t.Error("WaitForEdge returned false for the door's flip")
		}
	case <-time.After(testkit.Scale(time.Second)):
		t.Fatal("WaitForEdge missed the flip")
	}
	for door.WaitForEdge(0) { // drain
	}

	// Halt ends a wait without a timeout; so does In.
	for _, stop := range []func() error{
		door.Halt,
		func() error { return door.In(gpio.PullUp, gpio.BothEdges) },
	} {
		go func() { done <- door.WaitForEdge(-1) }()
		time.Sleep(30 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("WaitForEdge(-1) returned before Halt or In")
		default:
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-done:
			if got {
				t.Error("WaitForEdge returned true when stopped")
			}
		case <-time.After(testkit.Scale(time.Second)):
			t.Fatal("Halt or In did not end WaitForEdge")
		}
	}

	// Toggle makes an edge at once; falling-edge detection takes only
	// the way down.
	if err := door.In(gpio.PullUp, gpio.FallingEdge); err != nil {
		t.Fatal(err)
	}
	before := door.Read()
	if err := w.Toggle(PinDoor); err != nil {
		t.Fatal(err)
	}
	if err := w.Toggle(PinDoor); err != nil {
		t.Fatal(err)
	}
	if door.Read() != before {
		t.Error("two toggles did not restore the level")
	}
	if !door.WaitForEdge(0) || door.WaitForEdge(0) {
		t.Error("two toggles are not exactly one falling edge")
	}
	if err := w.Toggle(PinOut0); err == nil {
		t.Error("Toggle on an output succeeded")
	}
	// Without edge detection there is nothing to wait for.
	if err := door.In(gpio.PullUp, gpio.NoEdge); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour)
	if door.WaitForEdge(time.Second) {
		t.Error("WaitForEdge true with NoEdge")
	}
}

func TestSimOutputs(t *testing.T) {
	w, _ := newTestWorld(t, 5)
	for _, name := range []string{PinOut0, PinOut1, PinOut2, PinOut3} {
		p := mustPin(t, w, name)
		for _, l := range []gpio.Level{gpio.High, gpio.Low, gpio.High} {
			if err := p.Out(l); err != nil {
				t.Fatal(err)
			}
			if got, err := w.Level(name); err != nil || got != l {
				t.Errorf("%s: Level %v, %v after Out(%v)", name, got, err, l)
			}
			if got := p.Read(); got != l {
				t.Errorf("%s: Read %v after Out(%v)", name, got, l)
			}
		}
		if got := p.(pin.PinFunc).Func(); got != gpio.OUT_HIGH {
			t.Errorf("%s: Func %q, want %q", name, got, gpio.OUT_HIGH)
		}
	}
	// Others keep their own level.
	if err := mustPin(t, w, PinOut2).Out(gpio.Low); err != nil {
		t.Fatal(err)
	}
	if l, _ := w.Level(PinOut1); l != gpio.High {
		t.Error("driving SIM_OUT2 changed SIM_OUT1")
	}
	// Released to an input, the line reads its pull.
	p := mustPin(t, w, PinOut1)
	if err := p.In(gpio.PullDown, gpio.NoEdge); err != nil {
		t.Fatal(err)
	}
	if l, _ := w.Level(PinOut1); l != gpio.Low {
		t.Error("an output released with a pull-down still reads high")
	}
	if err := mustPin(t, w, PinDoor).Out(gpio.High); err == nil || !strings.Contains(err.Error(), "door") {
		t.Errorf("Out on the door contact: %v, want an error naming it", err)
	}
	if err := p.PWM(gpio.DutyHalf, 0); err == nil {
		t.Error("PWM succeeded")
	}
}

// TestSimPinSleepsOnSystemClock checks that on the system clock a waiting
// pin wakes for its schedule's next event, for Toggle and for its timeout,
// and for nothing else: an idle gateway must not wake for its simulated
// lines.
func TestSimPinSleepsOnSystemClock(t *testing.T) {
	w := New(6)
	door := mustPin(t, w, PinDoor)
	if err := door.In(gpio.PullUp, gpio.BothEdges); err != nil {
		t.Fatal(err)
	}

	// The door's first flip is 20 to 90 s away: a wait of 300 ms looks at
	// the line when it starts and when its time is up, not in between.
	before := w.Wakeups()
	if door.WaitForEdge(300 * time.Millisecond) {
		t.Fatal("an edge long before the door's first flip")
	}
	if n := w.Wakeups() - before; n != 2 {
		t.Errorf("a quiet wait of 300 ms woke %d times, want 2 (its start and its timeout)", n)
	}

	// A toggle wakes the wait at once.
	done := make(chan bool, 1)
	before = w.Wakeups()
	go func() { done <- door.WaitForEdge(time.Hour) }()
	if err := w.Toggle(PinDoor); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if !got {
			t.Error("WaitForEdge returned false for a toggle")
		}
	case <-time.After(testkit.Scale(2 * time.Second)):
		t.Fatal("WaitForEdge missed the toggle")
	}
	if n := w.Wakeups() - before; n > 2 {
		t.Errorf("waiting for a toggle woke %d times, want at most 2", n)
	}

	// The meter's next pulse, moved 50 ms ahead, ends a wait by itself,
	// with one wake-up for it.
	meter, err := w.pin(PinMeter)
	if err != nil {
		t.Fatal(err)
	}
	if err := meter.In(gpio.Float, gpio.RisingEdge); err != nil {
		t.Fatal(err)
	}
	meter.mu.Lock()
	meter.catchUp(time.Now())
	meter.sched.at, meter.sched.set = time.Now().Add(50*time.Millisecond), gpio.High
	meter.level, meter.pending = gpio.Low, 0
	meter.mu.Unlock()
	before = w.Wakeups()
	if !meter.WaitForEdge(testkit.Scale(5 * time.Second)) {
		t.Fatal("WaitForEdge missed the meter's scheduled pulse")
	}
	if n := w.Wakeups() - before; n != 2 {
		t.Errorf("waiting for a pulse 50 ms ahead woke %d times, want 2 (its start and the pulse)", n)
	}
	if meter.Read() != gpio.High {
		t.Error("the meter is not high after its rising edge")
	}
}
