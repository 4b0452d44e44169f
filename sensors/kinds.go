package sensors

import (
	"log/slog"
	"maps"
	"slices"
	"strings"

	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/i2c"
)

// kinds is every sensor kind fieldgate drives, by name. This list is the
// one place that says which kinds exist: each driver file defines its Kind,
// and a kind is known because it is listed here, not because its file is
// linked, so `fieldgate check` and `run` give the same answers in every
// build.
var kinds = byName(
	ads1015Kind,
	ads1115Kind,
	bme280Kind,
	bmp280Kind,
	ds18b20Kind,
	gpioInKind,
	ina219Kind,
	sht3xKind,
	sht4xKind,
)

// byName indexes ks by name. A name listed twice panics when the package
// is initialised: it is a programming error, and every test would show it.
func byName(ks ...Kind) map[string]Kind {
	m := make(map[string]Kind, len(ks))
	for _, k := range ks {
		if _, dup := m[k.Name]; dup {
			panic("sensors: kind " + k.Name + " listed twice")
		}
		m[k.Name] = k
	}
	return m
}

// Kinds returns the known kinds sorted by name.
func Kinds() []Kind {
	return slices.SortedFunc(maps.Values(kinds), func(a, b Kind) int { return strings.Compare(a.Name, b.Name) })
}

func lookup(name string) (Kind, bool) {
	k, ok := kinds[name]
	return k, ok
}

// BusType is the kind of bus a driver's devices are wired to.
type BusType int

// The buses drivers use.
const (
	BusI2C  BusType = iota + 1 // address is a 7-bit I²C address such as 0x76
	BusGPIO                    // address is a pin name such as GPIO17
	BusW1                      // address is a kernel 1-Wire device id such as 28-0316a279f3ff
)

// Kind is one driver: what the configuration's kind: names.
type Kind struct {
	Name string // as written in kind:, such as bme280
	Doc  string // one line for help and error messages
	Bus  BusType
	// Addresses are the I²C addresses the chip can be strapped to; they
	// name likely devices in a bus scan and catch a mistyped address.
	Addresses []uint16
	// Channels tells whether the kind takes channels: (an ADC does).
	Channels bool
	// Parse checks a sensor's options and channels without touching any
	// hardware and returns how to open it; problems go to s.Fail.
	Parse func(s *Spec) Opener
}

// Opener opens one configured device on its connected bus.
type Opener func(c Conn) (Device, error)

// Conn is the bus end a device is opened on; only the field for the
// kind's BusType is set, and Log.
type Conn struct {
	I2C   i2c.Bus    // the bus, for BusI2C
	Pin   gpio.PinIO // the pin, for BusGPIO
	W1Dir string     // the device's sysfs directory, for BusW1
	// Log is the sensor's logger, for what a driver must say without
	// failing, such as falling back to polling; nil discards.
	Log *slog.Logger
}
