package sensors

// Sensirion SHT3x and SHT4x humidity and temperature sensors on I²C.
//
// Both chips take one measurement per command and answer with two 16-bit
// words, each followed by a CRC-8. We use the commands that do not stretch
// the clock: the Raspberry Pi's I²C controller mishandles clock stretching,
// so the driver waits the datasheet's maximum conversion time itself and
// then reads. An SHT3x that is still converting refuses the read header
// (a NACK); the read-out is retried a few times for that case.
//
// On open each chip is soft-reset and identified: an SHT3x by its status
// register, an SHT4x by its serial number. Both answers carry CRCs; when
// they do not match, the device at the address is taken to be some other
// chip (the INA219 and OPT3001 share 0x44 and 0x45), so open fails with
// ErrWrongDevice rather than ErrCRC. A noisy bus gives the same symptom,
// and the message says so.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"periph.io/x/conn/v3/i2c"
)

// The kinds this file drives, listed in the table in kinds.go.
var (
	sht3xKind = Kind{
		Name:      "sht3x",
		Doc:       "Sensirion SHT30/SHT31/SHT35 temperature and humidity (I²C)",
		Bus:       BusI2C,
		Addresses: []uint16{0x44, 0x45},
		Parse:     sht3x.parse,
	}
	sht4xKind = Kind{
		Name:      "sht4x",
		Doc:       "Sensirion SHT40/SHT41/SHT45 temperature and humidity (I²C)",
		Bus:       BusI2C,
		Addresses: []uint16{0x44, 0x45, 0x46},
		Parse:     sht4x.parse,
	}
)

// shtPrecisions are the values of option precision, indexing the model's
// commands and conversion times.
var shtPrecisions = []string{"high", "medium", "low"}

// shtModel is what differs between the two families.
type shtModel struct {
	kind     string
	measure  [3][]byte        // the measurement command, by precision
	convTime [3]time.Duration // the datasheet's maximum conversion time, by precision
	humidity func(raw uint16) float64
	identify func(d *shtDevice) error // soft reset and identity check, on open
}

var sht3x = &shtModel{
	kind: "sht3x",
	// Single shot, clock stretching disabled (datasheet table 9).
	measure:  [3][]byte{{0x24, 0x00}, {0x24, 0x0b}, {0x24, 0x16}},
	convTime: [3]time.Duration{15500 * time.Microsecond, 6500 * time.Microsecond, 4500 * time.Microsecond},
	humidity: func(raw uint16) float64 { return 100 * float64(raw) / 65535 },
	identify: (*shtDevice).identify3x,
}

var sht4x = &shtModel{
	kind:     "sht4x",
	measure:  [3][]byte{{0xfd}, {0xf6}, {0xe0}},
	convTime: [3]time.Duration{8300 * time.Microsecond, 4500 * time.Microsecond, 1600 * time.Microsecond},
	// The formula reaches -6 % and 119 %; the datasheet asks for the
	// result to be cropped to what humidity can be.
	humidity: func(raw uint16) float64 { return min(max(-6+125*float64(raw)/65535, 0), 100) },
	identify: (*shtDevice).identify4x,
}

// Command timings outside the measurement.
const (
	// sht3xResetTime and sht4xResetTime are the longest a chip takes to
	// come back after a soft reset (1.5 ms and 1 ms), rounded up.
	sht3xResetTime = 2 * time.Millisecond
	sht4xResetTime = 1 * time.Millisecond
	// shtSerialTime is how long an SHT4x needs before its serial number
	// can be read; a chip that is slower refuses the read and it is
	// retried.
	shtSerialTime = 1 * time.Millisecond
	// shtBusyRetries and shtBusyWait bound the read-outs a chip may
	// refuse because it is still busy: a few milliseconds beyond the
	// datasheet's maximum covers a chip at the edge of its tolerance
	// without hiding a device that has gone.
	shtBusyRetries = 3
	shtBusyWait    = 1 * time.Millisecond
)

func (m *shtModel) parse(s *Spec) Opener {
	p := slices.Index(shtPrecisions, s.Choice("precision", shtPrecisions[0], shtPrecisions...))
	addr := s.Addr
	return func(c Conn) (Device, error) { return m.open(c.I2C, addr, p) }
}

// shtDevice is one opened SHT3x or SHT4x.
type shtDevice struct {
	model    *shtModel
	bus      i2c.Bus
	addr     uint16
	cmd      []byte
	convTime time.Duration
	name     string
	qs       []Quantity
	// timer is reused for every wait so that a reading does not allocate.
	timer *time.Timer
	buf   [6]byte
}

func (m *shtModel) open(bus i2c.Bus, addr uint16, precision int) (*shtDevice, error) {
	name := fmt.Sprintf("%s at 0x%02x", m.kind, addr)
	if bus == nil {
		return nil, fmt.Errorf("sensors: %s: no I²C bus to open it on", name)
	}
	d := &shtDevice{
		model:    m,
		bus:      bus,
		addr:     addr,
		cmd:      m.measure[precision],
		convTime: m.convTime[precision],
		name:     name,
		qs: []Quantity{
			{Name: "temperature", Unit: "°C", Decimals: 2, Min: -40, Max: 125, Class: "temperature"},
			{Name: "humidity", Unit: "%", Decimals: 1, Min: 0, Max: 100, Class: "humidity"},
		},
		timer: time.NewTimer(time.Hour),
	}
	d.timer.Stop()
	if err := m.identify(d); err != nil {
		d.timer.Stop()
		return nil, err
	}
	return d, nil
}

// identify3x resets an SHT3x and checks that its status register answers
// with a valid CRC.
func (d *shtDevice) identify3x() error {
	if err := d.tx([]byte{0x30, 0xa2}, nil, "soft reset"); err != nil {
		return d.openError(err)
	}
	if err := d.wait(context.Background(), sht3xResetTime); err != nil {
		return err
	}
	if err := d.tx([]byte{0xf3, 0x2d}, nil, "read status"); err != nil {
		return d.openError(err)
	}
	var st [3]byte
	if err := d.readOut(context.Background(), st[:], "read status"); err != nil {
		return d.openError(err)
	}
	if got, want := st[2], sensirionCRC(st[:2]); got != want {
		return d.notThisChip("status register", st[:], got, want)
	}
	return nil
}

// identify4x resets an SHT4x and reads its serial number, which goes into
// String.
func (d *shtDevice) identify4x() error {
	if err := d.tx([]byte{0x94}, nil, "soft reset"); err != nil {
		return d.openError(err)
	}
	if err := d.wait(context.Background(), sht4xResetTime); err != nil {
		return err
	}
	if err := d.tx([]byte{0x89}, nil, "read serial number"); err != nil {
		return d.openError(err)
	}
	if err := d.wait(context.Background(), shtSerialTime); err != nil {
		return err
	}
	var sn [6]byte
	if err := d.readOut(context.Background(), sn[:], "read serial number"); err != nil {
		return d.openError(err)
	}
	for i := 0; i < 6; i += 3 {
		if got, want := sn[i+2], sensirionCRC(sn[i:i+2]); got != want {
			return d.notThisChip("serial number", sn[:], got, want)
		}
	}
	serial := uint32(sn[0])<<24 | uint32(sn[1])<<16 | uint32(sn[3])<<8 | uint32(sn[4])
	d.name = fmt.Sprintf("%s (serial %08x)", d.name, serial)
	return nil
}

func (d *shtDevice) openError(err error) error {
	if errors.Is(err, ErrNoAck) {
		return fmt.Errorf("%w (is an %s wired and powered, and is its address 0x%02x right?)", err, d.model.kind, d.addr)
	}
	return err
}

func (d *shtDevice) notThisChip(what string, answer []byte, got, want byte) error {
	return fmt.Errorf("sensors: %s: %s answer % x has checksum 0x%02x where 0x%02x was due: "+
		"the device at 0x%02x is not an %s, or the bus is too noisy: %w",
		d.name, what, answer, got, want, d.addr, d.model.kind, ErrWrongDevice)
}

// Quantities reports temperature and humidity.
func (d *shtDevice) Quantities() []Quantity { return d.qs }

// Read starts a measurement, waits for it and reads it out.
func (d *shtDevice) Read(ctx context.Context, vals []float64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sensors: %s: %w", d.name, err)
	}
	if err := d.tx(d.cmd, nil, "start measurement"); err != nil {
		return err
	}
	if err := d.wait(ctx, d.convTime); err != nil {
		return err
	}
	if err := d.readOut(ctx, d.buf[:], "read measurement"); err != nil {
		return err
	}
	for i, what := range [2]string{"temperature", "humidity"} {
		w := d.buf[3*i : 3*i+3]
		if got, want := w[2], sensirionCRC(w[:2]); got != want {
			return fmt.Errorf("sensors: %s: %s word % x has checksum 0x%02x where 0x%02x was due: %w", d.name, what, w[:2], got, want, ErrCRC)
		}
	}
	vals[0] = -45 + 175*float64(uint16(d.buf[0])<<8|uint16(d.buf[1]))/65535
	vals[1] = d.model.humidity(uint16(d.buf[3])<<8 | uint16(d.buf[4]))
	if err := dropImplausible(d.qs, vals); err != nil {
		return fmt.Errorf("sensors: %s: %w", d.name, err)
	}
	return nil
}

// Close releases the timer; the chip needs nothing.
func (d *shtDevice) Close() error {
	d.timer.Stop()
	return nil
}

// String names the chip and its address, and an SHT4x's serial number.
func (d *shtDevice) String() string { return d.name }

// tx runs one bus transaction and names it in an error.
func (d *shtDevice) tx(w, r []byte, what string) error {
	if err := d.bus.Tx(d.addr, w, r); err != nil {
		return fmt.Errorf("sensors: %s: %s: %w", d.name, what, err)
	}
	return nil
}

// readOut reads r, retrying while the chip refuses because it is busy.
func (d *shtDevice) readOut(ctx context.Context, r []byte, what string) error {
	for try := 0; ; try++ {
		err := d.bus.Tx(d.addr, nil, r)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrNoAck) || try == shtBusyRetries {
			return fmt.Errorf("sensors: %s: %s: %w", d.name, what, err)
		}
		if err := d.wait(ctx, shtBusyWait); err != nil {
			return err
		}
	}
}

// wait pauses for dur or until ctx is done, on the reused timer.
func (d *shtDevice) wait(ctx context.Context, dur time.Duration) error {
	d.timer.Reset(dur)
	select {
	case <-d.timer.C:
		return nil
	case <-ctx.Done():
		d.timer.Stop()
		return fmt.Errorf("sensors: %s: waiting for the measurement: %w", d.name, ctx.Err())
	}
}

// sensirionCRC is the CRC-8 Sensirion chips append to each word:
// polynomial 0x31 (x⁸+x⁵+x⁴+1), initial value 0xff, no reflection and no
// final XOR.
func sensirionCRC(data []byte) byte {
	crc := byte(0xff)
	for _, b := range data {
		crc ^= b
		for range 8 {
			if crc&0x80 != 0 {
				crc = crc<<1 ^ 0x31
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// dropImplausible replaces each value that is NaN or outside its
// quantity's range with NaN. Only when none is left does it return an
// error, wrapping ErrImplausible and naming every value; a reading with
// something usable in it is not a failure.
func dropImplausible(qs []Quantity, vals []float64) error {
	bad := 0
	for i, q := range qs {
		if v := vals[i]; math.IsNaN(v) || v < q.Min || v > q.Max {
			bad++
		}
	}
	if bad == 0 {
		return nil
	}
	var errs []error
	if bad == len(qs) {
		errs = make([]error, 0, bad)
	}
	for i, q := range qs {
		if v := vals[i]; math.IsNaN(v) || v < q.Min || v > q.Max {
			if errs != nil {
				errs = append(errs, implausible(q, v))
			}
			vals[i] = math.NaN()
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}
