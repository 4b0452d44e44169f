package sensors

import (
	"context"
	"errors"
	"fmt"
)

// Quantity describes one value a device reports: one topic, one payload.
type Quantity struct {
	Name     string  // the topic level, such as temperature
	Unit     string  // as published, such as °C; empty for a count or a state
	Decimals int     // digits after the point in the payload
	Min, Max float64 // the physically possible range; a value outside is implausible
	// Class is Home Assistant's device_class, such as temperature; empty
	// when none fits.
	Class string
	// Binary marks a 0/1 state (a door contact): discovered as a
	// binary_sensor rather than a sensor.
	Binary bool
	// Total marks a count that only grows (pulses from a meter): discovered
	// with state_class total_increasing.
	Total bool
}

// Device is one opened sensor. Its methods are called from one goroutine
// at a time.
type Device interface {
	// Quantities lists what Read reports, in order; it does not change
	// while the device is open.
	Quantities() []Quantity
	// Read takes one reading into vals, one value per quantity. A value
	// outside its quantity's range is NaN (or left for the poller to
	// drop); either way it is counted as implausible and not published.
	// An error means no value was taken.
	// ctx carries the read timeout; drivers check it between bus
	// transactions and while waiting for a conversion.
	Read(ctx context.Context, vals []float64) error
	// Close releases the device; a device with outputs leaves them safe.
	Close() error
	String() string
}

// Watcher is implemented by devices that notice a change between polls,
// such as a GPIO input on an interrupt edge: a receive on Changed means a
// Read now would report something new. The poller reads and publishes at
// once rather than waiting for the interval.
type Watcher interface {
	Changed() <-chan struct{}
}

// Errors a driver returns (wrapped) so that failures are counted by reason.
var (
	// ErrNoAck means the device did not answer on the bus: absent,
	// unpowered or miswired.
	ErrNoAck = errors.New("no answer on the bus")
	// ErrCRC means the device answered but its checksum did not match the
	// data: a noisy or too long bus.
	ErrCRC = errors.New("checksum mismatch")
	// ErrImplausible means the device answered with a value outside what it
	// can measure, such as a DS18B20's 85 °C power-on value.
	ErrImplausible = errors.New("implausible value")
	// ErrWrongDevice means something answered at the address, but not the
	// chip the configuration names.
	ErrWrongDevice = errors.New("a different device answers")
)

// Failure reasons, as counted in Stats and shown in status messages.
const (
	ReasonNoAck       = "no_ack"
	ReasonCRC         = "crc"
	ReasonImplausible = "implausible"
	ReasonTimeout     = "timeout"
	ReasonWrongDevice = "wrong_device"
	ReasonOther       = "error"
)

// Reason classifies a read error for counting.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoAck):
		return ReasonNoAck
	case errors.Is(err, ErrCRC):
		return ReasonCRC
	case errors.Is(err, ErrImplausible):
		return ReasonImplausible
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, ErrWrongDevice):
		return ReasonWrongDevice
	}
	return ReasonOther
}

// implausible returns an ErrImplausible naming the quantity and its range.
func implausible(q Quantity, v float64) error {
	return fmt.Errorf("%s %g%s outside %g..%g: %w", q.Name, v, q.Unit, q.Min, q.Max, ErrImplausible)
}
