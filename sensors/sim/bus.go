package sim

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"periph.io/x/conn/v3/physic"
)

// bus is the simulated I²C bus. One mutex serialises transactions, as the
// wires do.
type bus struct {
	w *World

	mu     sync.Mutex
	speed  physic.Frequency
	slots  map[uint16]*slot
	nack   map[uint16]int // transactions still to refuse, by address
	badCRC int            // SHT3x read-outs still to corrupt
}

// slot is one chip on the bus and the faults injected into it.
type slot struct {
	chip       chip
	absent     bool
	outOfRange bool
}

// chip is a register-level fake. Its methods run under the bus mutex.
type chip interface {
	name() string
	// powerOn puts every register in its power-on state.
	powerOn()
	// tx runs one transaction whose address the chip acknowledged: w is
	// written, then r read after a repeated start. It returns a refusal
	// for what the chip does not acknowledge.
	tx(c *txCtx, w, r []byte) error
}

// txCtx is what a chip sees of the world during one transaction.
type txCtx struct {
	w          *World
	now        time.Time // the world's clock
	outOfRange bool
	badCRC     *int
}

// values returns the environment at the transaction's time.
func (c *txCtx) values() Values { return c.w.ValuesAt(c.now) }

// busy reports whether an operation that started at start (in real time)
// and takes d is still running.
func (c *txCtx) busy(start time.Time, d time.Duration) bool {
	return !c.w.instant && time.Since(start) < d
}

// refusal is a chip not acknowledging, and why.
type refusal string

func (r refusal) Error() string { return string(r) }

func newBus(w *World) *bus {
	b := &bus{
		w:     w,
		speed: 100 * physic.KiloHertz,
		slots: map[uint16]*slot{},
		nack:  map[uint16]int{},
	}
	for addr, c := range map[uint16]chip{
		AddrINA219:  &ina219Chip{},
		AddrSHT3x:   &sht3xChip{},
		AddrADS1115: &ads1115Chip{},
		AddrBME280:  &bme280Chip{},
	} {
		c.powerOn()
		b.slots[addr] = &slot{chip: c}
	}
	return b
}

// String names the bus.
func (b *bus) String() string { return "sim-i2c" }

// SetSpeed records the clock frequency; the simulated chips work at any.
func (b *bus) SetSpeed(f physic.Frequency) error {
	if f <= 0 {
		return fmt.Errorf("sim: I²C speed %s is not a frequency; use one such as 100kHz", f)
	}
	b.mu.Lock()
	b.speed = f
	b.mu.Unlock()
	return nil
}

// Tx runs one transaction. Like Linux's i2c-dev under periph, an empty
// transaction does nothing and succeeds. An address nobody acknowledges
// fails with an error wrapping syscall.EREMOTEIO.
func (b *bus) Tx(addr uint16, w, r []byte) error {
	if addr > 0x7f {
		return fmt.Errorf("sim: I²C address 0x%x is not a 7-bit address", addr)
	}
	if len(w) == 0 && len(r) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.nack[addr]; n > 0 {
		b.nack[addr] = n - 1
		return nackError(addr, "a NACK was injected")
	}
	s := b.slots[addr]
	switch {
	case s == nil:
		return nackError(addr, "no device at this address")
	case s.absent:
		return nackError(addr, s.chip.name()+" removed from the bus")
	}
	c := &txCtx{w: b.w, now: b.w.now(), outOfRange: s.outOfRange, badCRC: &b.badCRC}
	err := s.chip.tx(c, w, r)
	var ref refusal
	if errors.As(err, &ref) {
		return nackError(addr, s.chip.name()+": "+string(ref))
	}
	return err
}

func nackError(addr uint16, why string) error {
	return fmt.Errorf("sim: I²C 0x%02x not acknowledged (%s): %w", addr, why, syscall.EREMOTEIO)
}

// NACK makes the next n transactions to addr fail as if no device
// acknowledged, whether or not a chip is there.
func (w *World) NACK(addr uint16, n int) {
	w.bus.mu.Lock()
	defer w.bus.mu.Unlock()
	w.bus.nack[addr] = max(n, 0)
}

// BadCRC makes the next n SHT3x read-outs (measurements or status) carry
// a wrong checksum after every word.
func (w *World) BadCRC(n int) {
	w.bus.mu.Lock()
	defer w.bus.mu.Unlock()
	w.bus.badCRC = max(n, 0)
}

// OutOfRange makes the chip at addr answer raw values outside what it can
// measure (on) or normal ones again (off): the BME280's data registers
// read all ones (187 °C, 100 %), the SHT3x reads 0xffff for both words
// with valid checksums (130 °C, 100 %), the ADS1115 converts every input
// at positive full scale, and the INA219's shunt register is at its
// limit with the bus register's overflow flag set.
func (w *World) OutOfRange(addr uint16, on bool) error {
	w.bus.mu.Lock()
	defer w.bus.mu.Unlock()
	s, err := w.bus.slot(addr)
	if err != nil {
		return err
	}
	s.outOfRange = on
	return nil
}

// SetPresent takes the chip at addr off the bus (false), so that it
// refuses every transaction, or puts it back (true). A chip put back
// starts from its power-on registers, like a device plugged in again:
// an INA219 forgets its calibration, a BME280 its oversampling.
func (w *World) SetPresent(addr uint16, present bool) error {
	w.bus.mu.Lock()
	defer w.bus.mu.Unlock()
	s, err := w.bus.slot(addr)
	if err != nil {
		return err
	}
	if present && s.absent {
		s.chip.powerOn()
	}
	s.absent = !present
	return nil
}

func (b *bus) slot(addr uint16) (*slot, error) {
	s := b.slots[addr]
	if s == nil {
		return nil, fmt.Errorf("sim: no simulated chip at 0x%02x; the chips are at 0x%02x (INA219), 0x%02x (SHT3x), 0x%02x (ADS1115) and 0x%02x (BME280)",
			addr, AddrINA219, AddrSHT3x, AddrADS1115, AddrBME280)
	}
	return s, nil
}

// Shared helpers of the register-level chips.

// putBE16 writes v big-endian into r, repeated to fill it: a 16-bit
// register read past its end keeps sending the same register.
func putBE16(r []byte, v uint16) {
	for i := range r {
		if i%2 == 0 {
			r[i] = byte(v >> 8)
		} else {
			r[i] = byte(v)
		}
	}
}
