package sensors

import (
	"context"
	"fmt"
	"math"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/ina219"
)

// Kind ina219: Texas Instruments' current and power monitor, which measures
// the voltage across a shunt resistor and on the bus it sits in, read
// through periph's ina219 driver. The chip converts continuously; Read
// takes its latest results.
//
// Options:
//
//	shunt_ohms   the shunt resistor (default 0.1)
//	max_current  the largest current expected, in amperes, which sets the
//	             resolution: max_current/32768 per step (default 3.2)
//
// The shunt sees at most ±320 mV, so max_current × shunt_ohms must not
// exceed 0.32 V; and the 16-bit calibration register cannot hold the
// scale below about 20.5 mV.

// ina219Kind is the kind this file drives, listed in the table in kinds.go.
var ina219Kind = Kind{
	Name:      "ina219",
	Doc:       "Texas Instruments INA219 current, voltage and power monitor",
	Bus:       BusI2C,
	Addresses: ina219Addresses,
	Parse:     parseINA219,
}

// ina219Addresses are set by wiring A0 and A1 each to GND, VS, SDA or SCL.
var ina219Addresses = []uint16{
	0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47,
	0x48, 0x49, 0x4a, 0x4b, 0x4c, 0x4d, 0x4e, 0x4f,
}

// The shunt voltage at full current, max_current × shunt_ohms, in volts.
const (
	// ina219MaxShuntV is the shunt ADC's range at gain /8.
	ina219MaxShuntV = 0.32
	// ina219MinShuntV is where the calibration value, 0.04096 /
	// (max_current/32768 × shunt_ohms), outgrows its 16-bit register.
	ina219MinShuntV = 0.04096 * 32768 / 65536
)

// ina219MaxBusV is the highest bus voltage the chip is rated to measure.
const ina219MaxBusV = 26

const (
	ina219RegConfig = 0x00
	// ina219Config is periph's setting (gain /8 for ±320 mV, 128-sample
	// averaging of shunt and bus, continuous) with BRNG set for the 32 V
	// bus range: periph leaves it at 16 V, too little for a 24 V bus.
	ina219Config = 0x3fff
	// ina219PowerDown is ina219Config with mode 000: power-down.
	ina219PowerDown = 0x3ff8
	// ina219Settle is one full conversion cycle at ina219Config (shunt
	// and bus, 68.10 ms each at 128 samples); until it has passed
	// after open the result registers hold no reading.
	ina219Settle = 137 * time.Millisecond
)

func parseINA219(s *Spec) Opener {
	before := s.failed
	shunt := s.Float("shunt_ohms", 0.1, 0.001, 10)
	maxI := s.Float("max_current", 3.2, 0.001, 320)
	r := physic.ElectricResistance(math.Round(shunt * float64(physic.Ohm)))
	i := physic.ElectricCurrent(math.Round(maxI * float64(physic.Ampere)))
	// Compare with a little slack: 3.2 × 0.1 is 0.32000000000000006.
	if v := maxI * shunt; s.failed == before && (ina219Calibration(r, i) > 0xffff || v > ina219MaxShuntV*(1+1e-9)) {
		// Point at the option the file wrote: a shunt_ohms that does
		// not suit the default max_current is where the line is.
		key, current := "options.max_current", fmt.Sprintf("%g A", maxI)
		if _, set := s.Options["max_current"]; !set {
			key, current = "options.shunt_ohms", fmt.Sprintf("%g A (the default max_current)", maxI)
		}
		s.Fail(key, "%s across %g Ω is %.4g V; at full current the shunt must see about %.3g to %g V (above, the INA219's input saturates; below, its calibration overflows): use a max_current from %.3g to %.3g A, or another shunt",
			current, shunt, v, ina219MinShuntV, ina219MaxShuntV, ina219MinShuntV/shunt, ina219MaxShuntV/shunt)
	}
	addr := s.Addr
	return func(c Conn) (Device, error) { return openINA219(c.I2C, addr, r, i) }
}

// ina219Calibration is the calibration register's value for shunt r and
// full current i, 0.04096 / (i/32768 × r), computed as periph does (with
// its current step truncated to whole nanoamperes), which refuses a value
// that does not fit the 16-bit register: a shunt voltage at full current
// below about 20.5 mV.
func ina219Calibration(r physic.ElectricResistance, i physic.ElectricCurrent) int64 {
	step := int64(i / (1 << 15))
	if step <= 0 || r <= 0 {
		return math.MaxInt64
	}
	// 0.04096 A·Ω in nA·nΩ, times 32768 for the step already divided out.
	const scale = int64(physic.Ampere) * int64(physic.Ohm) / 100000 << 12
	return scale / (step * int64(r))
}

// ina219Dev is an opened INA219.
type ina219Dev struct {
	addr   uint16
	raw    i2c.Bus // the bus as given, for the registers periph leaves alone
	bus    *periphBus
	dev    *ina219.Dev
	qs     []Quantity
	ready  time.Time // when the first conversion cycle is complete
	closed bool
}

func openINA219(bus i2c.Bus, addr uint16, shunt physic.ElectricResistance, maxI physic.ElectricCurrent) (Device, error) {
	lim := float64(maxI) / float64(physic.Ampere) * 1.1
	d := &ina219Dev{addr: addr, raw: bus, bus: &periphBus{Bus: bus}, qs: []Quantity{
		{Name: "voltage", Unit: "V", Decimals: 3, Min: 0, Max: ina219MaxBusV, Class: "voltage"},
		{Name: "current", Unit: "A", Decimals: 4, Min: -lim, Max: lim, Class: "current"},
		{Name: "power", Unit: "W", Decimals: 3, Min: 0, Max: ina219MaxBusV * lim, Class: "power"},
	}}
	dev, err := ina219.New(d.bus, &ina219.Opts{
		Address:       int(addr),
		SenseResistor: shunt,
		MaxCurrent:    maxI,
	})
	if err != nil {
		return nil, fmt.Errorf("sensors: %s: %w", d, d.bus.end(err))
	}
	d.dev = dev
	if err := d.writeConfig(ina219Config); err != nil {
		return nil, fmt.Errorf("sensors: %s: set 32 V bus range: %w", d, err)
	}
	d.ready = time.Now().Add(ina219Settle)
	return d, nil
}

func (d *ina219Dev) writeConfig(v uint16) error {
	return d.raw.Tx(d.addr, []byte{ina219RegConfig, byte(v >> 8), byte(v)}, nil)
}

// Quantities returns the bus voltage, the current and the power.
func (d *ina219Dev) Quantities() []Quantity { return d.qs }

// Read takes the chip's latest results; the first Read after open waits
// until the first conversion cycle is complete.
func (d *ina219Dev) Read(ctx context.Context, vals []float64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	if wait := time.Until(d.ready); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sensors: %s: waiting for the first conversion: %w", d, ctx.Err())
		case <-t.C:
		}
	}
	d.bus.begin(ctx)
	pm, err := d.dev.Sense()
	// periph's one error that no transaction caused is the math overflow
	// flag (OVF) in the bus voltage register, read before current and
	// power: the bus voltage is good, current and power are not.
	overflow := err != nil && d.bus.err == nil
	if err := d.bus.end(err); err != nil && !overflow {
		return fmt.Errorf("sensors: %s: read: %w", d, err)
	}
	vals[0] = float64(pm.Voltage) / float64(physic.Volt)
	if overflow {
		vals[1], vals[2] = math.NaN(), math.NaN()
	} else {
		vals[1] = float64(pm.Current) / float64(physic.Ampere)
		vals[2] = float64(pm.Power) / float64(physic.Watt)
	}
	if err := dropImplausible(d.qs, vals); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	return nil
}

// Close powers the chip down. periph's driver has no Halt, so Close writes
// the configuration register's mode bits itself.
func (d *ina219Dev) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	if err := d.writeConfig(ina219PowerDown); err != nil {
		return fmt.Errorf("sensors: %s: power down: %w", d, err)
	}
	return nil
}

// String names the kind and the address.
func (d *ina219Dev) String() string { return fmt.Sprintf("ina219 at 0x%02x", d.addr) }
