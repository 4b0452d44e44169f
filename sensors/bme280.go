package sensors

import (
	"context"
	"fmt"
	"slices"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/bmxx80"
)

// Kinds bme280 and bmp280: Bosch's environmental sensors, read in forced
// mode (one conversion per Read, the chip sleeping in between) through
// periph's bmxx80 driver.
//
// Options:
//
//	oversampling  1x, 2x, 4x, 8x or 16x for every quantity (default 4x)
//	filter        the IIR filter coefficient: off, 2, 4, 8 or 16 (default off)
//
// The two chips share addresses, registers and calibration; the BMP280
// lacks the humidity sensor. Open reads the chip id and refuses the other
// chip, so that a configuration naming bme280 does not silently publish no
// humidity.

// The kinds this file drives, listed in the table in kinds.go.
var (
	bme280Kind = Kind{
		Name:      "bme280",
		Doc:       "Bosch BME280 temperature, humidity and pressure sensor",
		Bus:       BusI2C,
		Addresses: bmx280Addresses,
		Parse:     func(s *Spec) Opener { return parseBMx280(s, true) },
	}
	bmp280Kind = Kind{
		Name:      "bmp280",
		Doc:       "Bosch BMP280 temperature and pressure sensor",
		Bus:       BusI2C,
		Addresses: bmx280Addresses,
		Parse:     func(s *Spec) Opener { return parseBMx280(s, false) },
	}
)

// bmx280Addresses are set by the SDO pin: low 0x76, high 0x77.
var bmx280Addresses = []uint16{0x76, 0x77}

// Registers, and the chip ids register 0xD0 holds.
const (
	bmx280RegID   = 0xD0
	bmx280RegConf = 0xF5 // config: t_sb[7:5] filter[4:2] spi3w_en[0]
	bme280ID      = 0x60
	bmp280ID      = 0x58
	bmp180ID      = 0x55
)

var (
	bmx280Oversamplings = []string{"1x", "2x", "4x", "8x", "16x"}
	bmx280Filters       = []string{"off", "2", "4", "8", "16"}
)

var (
	bmx280Temperature = Quantity{Name: "temperature", Unit: "°C", Decimals: 2, Min: -40, Max: 85, Class: "temperature"}
	bmx280Humidity    = Quantity{Name: "humidity", Unit: "%", Decimals: 1, Min: 0, Max: 100, Class: "humidity"}
	bmx280Pressure    = Quantity{Name: "pressure", Unit: "hPa", Decimals: 2, Min: 300, Max: 1100, Class: "pressure"}
)

func parseBMx280(s *Spec, bme bool) Opener {
	over := s.Choice("oversampling", "4x", bmx280Oversamplings...)
	filter := s.Choice("filter", "off", bmx280Filters...)
	// Both lists are in the order of periph's constants, which are the
	// register values: oversampling 1x is 1, filter off is 0.
	o := bmxx80.Oversampling(slices.Index(bmx280Oversamplings, over) + 1)
	opts := bmxx80.Opts{Temperature: o, Pressure: o, Humidity: o}
	if !bme {
		// Also keeps periph from counting humidity in its conversion wait.
		opts.Humidity = bmxx80.Off
	}
	f := bmxx80.Filter(slices.Index(bmx280Filters, filter))
	addr := s.Addr
	return func(c Conn) (Device, error) { return openBMx280(c.I2C, addr, bme, opts, f) }
}

// bmx280 is an opened BME280 or BMP280.
type bmx280 struct {
	name string // the kind: bme280 or bmp280
	addr uint16
	bus  *periphBus
	dev  *bmxx80.Dev
	qs   []Quantity
	env  physic.Env // reused by every Read

	closed bool
}

func openBMx280(bus i2c.Bus, addr uint16, bme bool, opts bmxx80.Opts, f bmxx80.Filter) (Device, error) {
	d := &bmx280{name: "bmp280", addr: addr, bus: &periphBus{Bus: bus}, qs: []Quantity{bmx280Temperature, bmx280Pressure}}
	if bme {
		d.name = "bme280"
		d.qs = []Quantity{bmx280Temperature, bmx280Humidity, bmx280Pressure}
	}
	// periph tells the chips apart itself, but only the BMP180 by a
	// different path and the others by a field it does not export, so read
	// the id here to refuse the wrong chip before configuring it.
	var id [1]byte
	if err := bus.Tx(addr, []byte{bmx280RegID}, id[:]); err != nil {
		return nil, fmt.Errorf("sensors: %s: read chip id: %w", d, err)
	}
	if err := bmx280Identify(d.name, addr, id[0]); err != nil {
		return nil, err
	}
	dev, err := bmxx80.NewI2C(d.bus, addr, &opts)
	if err != nil {
		return nil, fmt.Errorf("sensors: %s: %w", d, d.bus.end(err))
	}
	d.dev = dev
	if f != bmxx80.NoFilter {
		// periph writes the filter only together with a standby time,
		// which also switches the chip to normal (free-running) mode.
		// Forced mode filters too, one step per conversion, so set the
		// filter bits ourselves; the chip sleeps after NewI2C, when the
		// config register accepts writes. t_sb matters only in normal mode.
		if err := bus.Tx(addr, []byte{bmx280RegConf, byte(f) << 2}, nil); err != nil {
			return nil, fmt.Errorf("sensors: %s: set filter: %w", d, err)
		}
	}
	return d, nil
}

// bmx280Identify checks that chip id answers for kind.
func bmx280Identify(kind string, addr uint16, id byte) error {
	switch {
	case id == bme280ID && kind == "bme280", id == bmp280ID && kind == "bmp280":
		return nil
	case id == bme280ID:
		return fmt.Errorf("sensors: %s at 0x%02x: %w: a BME280 (chip id 0x%02x, with humidity) answers; use kind bme280", kind, addr, ErrWrongDevice, id)
	case id == bmp280ID:
		return fmt.Errorf("sensors: %s at 0x%02x: %w: a BMP280 (chip id 0x%02x, no humidity) answers; use kind bmp280", kind, addr, ErrWrongDevice, id)
	case id == bmp180ID:
		return fmt.Errorf("sensors: %s at 0x%02x: %w: a BMP180 (chip id 0x%02x) answers, which is not supported; use a BME280 or BMP280", kind, addr, ErrWrongDevice, id)
	}
	return fmt.Errorf("sensors: %s at 0x%02x: %w: chip id 0x%02x is neither a BME280 (0x%02x) nor a BMP280 (0x%02x); is another device at this address?", kind, addr, ErrWrongDevice, id, bme280ID, bmp280ID)
}

// Quantities returns temperature, humidity (BME280 only) and pressure.
func (d *bmx280) Quantities() []Quantity { return d.qs }

// Read triggers one forced conversion and reads its result. periph waits
// out the conversion (at most 98 ms at 16x) without looking at ctx; the
// bus checks ctx before each transaction, including the status polls.
func (d *bmx280) Read(ctx context.Context, vals []float64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	d.bus.begin(ctx)
	if err := d.bus.end(d.dev.Sense(&d.env)); err != nil {
		return fmt.Errorf("sensors: %s: read: %w", d, err)
	}
	vals[0] = d.env.Temperature.Celsius()
	p := 1
	if len(d.qs) == 3 {
		vals[1] = float64(d.env.Humidity) / float64(physic.PercentRH)
		p = 2
	}
	vals[p] = float64(d.env.Pressure) / float64(100*physic.Pascal)
	if err := dropImplausible(d.qs, vals); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	return nil
}

// Close puts the chip to sleep. In forced mode it already sleeps after
// every conversion, so periph's Halt has nothing to send.
func (d *bmx280) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	if err := d.dev.Halt(); err != nil {
		return fmt.Errorf("sensors: %s: halt: %w", d, err)
	}
	return nil
}

// String names the kind and the address.
func (d *bmx280) String() string { return fmt.Sprintf("%s at 0x%02x", d.name, d.addr) }

// periphBus is the bus a periph driver is given. It fails a transaction
// once the read's context is done, so that a driver that sleeps or polls
// stops at its next transaction; and it keeps the first bus error, because
// some periph drivers drop it (bmxx80 formats it with %v, ina219 replaces
// it with its own) and errors.Is(err, ErrNoAck) must still hold.
//
// The context is held only between begin and end, for one Read.
type periphBus struct {
	i2c.Bus
	ctx context.Context
	err error
}

// Tx runs one transaction unless the read's context is done.
func (b *periphBus) Tx(addr uint16, w, r []byte) error {
	if b.ctx != nil {
		if err := b.ctx.Err(); err != nil {
			b.keep(err)
			return err
		}
	}
	err := b.Bus.Tx(addr, w, r)
	if err != nil {
		b.keep(err)
	}
	return err
}

func (b *periphBus) keep(err error) {
	if b.err == nil {
		b.err = err
	}
}

// begin starts one read under ctx.
func (b *periphBus) begin(ctx context.Context) {
	b.ctx = ctx
	b.err = nil
}

// end finishes an operation on the driver, returning the driver's err
// with the bus's own error restored in its place when there is one.
func (b *periphBus) end(err error) error {
	if err != nil && b.err != nil {
		err = b.err
	}
	b.ctx, b.err = nil, nil
	return err
}
