// Package sim is fieldgate's simulated hardware: an I²C bus with
// register-level fake devices and a few GPIO pins, so that the real drivers
// run, and the whole data path can be exercised, without any wiring.
//
// The bus carries four chips, each answering at the register level as the
// datasheet describes, so that periph's drivers and ours talk to them
// unchanged:
//
//	0x40  INA219 power monitor on the 12 V battery feed (0.1 Ω shunt)
//	0x44  SHT3x temperature and humidity
//	0x48  ADS1115 ADC: A0 a 4–20 mA tank pressure transmitter across 100 Ω,
//	      A1 the battery through a 1:4 divider, A2 and A3 near 0 V
//	0x76  BME280 temperature, humidity and pressure
//
// Any other address refuses like an empty address on Linux: the
// transaction fails with an error wrapping syscall.EREMOTEIO.
//
// The pins are SIM_IN0, a door contact that toggles every 20 to 90 s;
// SIM_IN1, a water meter giving a pulse every 1 to 5 s; and SIM_OUT0 to
// SIM_OUT3, outputs whose level Level reports.
//
// What the chips measure is a function of the seed and the world's clock
// only (see Values), so a test with a fixed seed and an injected clock
// (WithClock) reads the same values every run. The pins' schedules start
// when the World is made. On the system clock a pin waiting for an edge
// sleeps until its schedule's next event, or until Toggle or Halt, and
// nothing else wakes it; an injected clock can jump at any moment, so
// there a waiting pin looks at it every 10 ms. Conversion and measurement times, on the other
// hand, pass in real time, as the drivers sleep in real time; WithInstant
// makes every conversion finish at once.
//
// Fault injection for tests: NACK, BadCRC, OutOfRange and SetPresent.
package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/i2c"
)

// The addresses of the simulated chips.
const (
	AddrINA219  uint16 = 0x40
	AddrSHT3x   uint16 = 0x44
	AddrADS1115 uint16 = 0x48
	AddrBME280  uint16 = 0x76
)

// The names of the simulated pins.
const (
	PinDoor  = "SIM_IN0" // door contact: toggles every 20 to 90 s
	PinMeter = "SIM_IN1" // water meter: a pulse every 1 to 5 s
	PinOut0  = "SIM_OUT0"
	PinOut1  = "SIM_OUT1"
	PinOut2  = "SIM_OUT2"
	PinOut3  = "SIM_OUT3"
)

// World is one set of simulated hardware. It is safe for concurrent use.
type World struct {
	seed    uint64
	now     func() time.Time
	clocked bool // now was injected by WithClock: it can jump at any time
	instant bool
	origin  time.Time // the clock when the World was made: where pin schedules start

	bus  *bus
	pins []*simPin

	wakeups atomic.Uint64 // looks at a line by WaitForEdge: see Wakeups
}

// Option configures a World made by New.
type Option func(*World)

// WithClock makes now the world's clock, which drives every simulated
// value and the pins' schedules; time.Now when not given. A test passes a
// clock it sets, so that readings are reproducible. Pins waiting for an
// edge look at an injected clock every 10 ms, since they cannot know when
// it moves.
func WithClock(now func() time.Time) Option {
	return func(w *World) { w.now, w.clocked = now, true }
}

// WithInstant makes conversions and measurements finish at once, for
// tests that drive the chips without waiting; by default a chip is busy
// for its datasheet conversion time, in real time.
func WithInstant() Option {
	return func(w *World) { w.instant = true }
}

// New returns a simulated world whose readings are drawn from seed.
func New(seed int64, opts ...Option) *World {
	w := &World{seed: uint64(seed), now: time.Now}
	for _, o := range opts {
		o(w)
	}
	w.origin = w.now()
	w.bus = newBus(w)
	w.pins = newPins(w)
	return w
}

// Now returns the time on the world's clock.
func (w *World) Now() time.Time { return w.now() }

// Values returns what the simulated chips measure now.
func (w *World) Values() Values { return w.ValuesAt(w.now()) }

// I2C returns the simulated I²C bus; every call returns the same bus.
func (w *World) I2C() i2c.Bus { return w.bus }

// Addresses lists the addresses of the simulated chips, present or not.
func (w *World) Addresses() []uint16 {
	return slices.Sorted(func(yield func(uint16) bool) {
		for a := range w.bus.slots {
			if !yield(a) {
				return
			}
		}
	})
}

// Pin returns the simulated GPIO pin name; every call for a name returns
// the same pin.
func (w *World) Pin(name string) (gpio.PinIO, error) {
	p, err := w.pin(name)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// PinNames lists the simulated pins.
func (w *World) PinNames() []string {
	names := make([]string, len(w.pins))
	for i, p := range w.pins {
		names[i] = p.name
	}
	return names
}

func (w *World) pin(name string) (*simPin, error) {
	for _, p := range w.pins {
		if p.name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("sim: no pin %q; the simulated pins are %s", name, strings.Join(w.PinNames(), ", "))
}

// Wakeups returns how many times the pins' WaitForEdge calls have looked
// at their lines since the World was made: once when a wait starts, and
// once per wake-up after. It shows what simulated lines cost a gateway at
// rest.
func (w *World) Wakeups() uint64 { return w.wakeups.Load() }

// Level returns the level on pin name: what an input's signal is now, or
// what an output drives. An unknown name is an error naming the pins.
func (w *World) Level(name string) (gpio.Level, error) {
	p, err := w.pin(name)
	if err != nil {
		return gpio.Low, err
	}
	return p.Read(), nil
}

// Toggle flips input pin name now, as if its contact moved: an edge that
// WaitForEdge reports. The pin's schedule goes on from there.
func (w *World) Toggle(name string) error {
	p, err := w.pin(name)
	if err != nil {
		return err
	}
	return p.toggle()
}
