package sim

import (
	"fmt"
	"math"
	"time"
)

// sht3xChip is a Sensirion SHT3x-DIS in single-shot mode. Commands are
// 16-bit words; results are 16-bit words each followed by its CRC-8.
//
// Timing follows the datasheet and the chip: after a command without
// clock stretching the chip refuses (NACKs) a read header until the
// measurement is done, taking the datasheet's maximum time (15, 6 or 4 ms
// for high, medium or low repeatability); with clock stretching the read
// waits for the result instead. After a soft reset it refuses everything
// for 1.5 ms. With no result to give, a read header is refused too, so a
// read probe such as i2cdetect -r passes the chip by. Periodic
// measurement and the alert limits are not simulated.
type sht3xChip struct {
	status  uint16
	out     []byte    // what the next read header returns, once ready
	ready   time.Time // when out can be read, in real time
	stretch bool      // out was asked for with clock stretching
	resetAt time.Time // the last soft reset, in real time
}

// SHT3x commands (datasheet section 4).
const (
	sht3xSingleHigh        = 0x2400
	sht3xSingleMedium      = 0x240B
	sht3xSingleLow         = 0x2416
	sht3xSingleHighStretch = 0x2C06
	sht3xSingleMedStretch  = 0x2C0D
	sht3xSingleLowStretch  = 0x2C10
	sht3xSoftReset         = 0x30A2
	sht3xReadStatus        = 0xF32D
	sht3xClearStatus       = 0x3041
	sht3xHeaterOn          = 0x306D
	sht3xHeaterOff         = 0x3066
	sht3xBreak             = 0x3093
)

// Status register bits.
const (
	sht3xStatusAlert   = 1 << 15
	sht3xStatusHeater  = 1 << 13
	sht3xStatusRHAlert = 1 << 11
	sht3xStatusTAlert  = 1 << 10
	sht3xStatusReset   = 1 << 4
)

// sht3xResetTime is the datasheet's maximum soft reset time.
const sht3xResetTime = 1500 * time.Microsecond

func (c *sht3xChip) name() string { return "SHT3x" }

func (c *sht3xChip) powerOn() {
	*c = sht3xChip{status: sht3xStatusAlert | sht3xStatusReset}
}

func (c *sht3xChip) tx(x *txCtx, w, r []byte) error {
	if x.busy(c.resetAt, sht3xResetTime) {
		return refusal("soft reset in progress")
	}
	// While measuring, the chip answers nothing, except a read header
	// after a clock-stretching command, which it holds until done.
	measuring := c.out != nil && !x.w.instant && time.Now().Before(c.ready)
	if measuring && (!c.stretch || len(w) > 0) {
		return refusal("measurement in progress")
	}
	switch {
	case len(w) == 1:
		// Half a command: the chip acknowledges the byte and, at the
		// stop, forgets it.
	case len(w) == 2:
		if err := c.command(x, uint16(w[0])<<8|uint16(w[1])); err != nil {
			return err
		}
	case len(w) > 2:
		return refusal(fmt.Sprintf("command 0x%02x%02x takes no data", w[0], w[1]))
	}
	if len(r) == 0 {
		return nil
	}
	if c.out == nil {
		return refusal("no measurement to read")
	}
	if wait := time.Until(c.ready); wait > 0 && !x.w.instant {
		if !c.stretch {
			return refusal("measurement in progress")
		}
		// Clock stretching: the chip holds SCL low, and the bus with it,
		// until the result is there.
		time.Sleep(wait)
	}
	out := c.out
	c.out = nil
	if *x.badCRC > 0 {
		*x.badCRC--
		out = append([]byte(nil), out...)
		for i := 2; i < len(out); i += 3 {
			out[i] ^= 0x5A
		}
	}
	n := copy(r, out)
	for i := n; i < len(r); i++ {
		r[i] = 0xFF // past the result the master reads a released bus
	}
	return nil
}

func (c *sht3xChip) command(x *txCtx, cmd uint16) error {
	var dur time.Duration
	switch cmd {
	case sht3xSingleHigh, sht3xSingleHighStretch:
		dur = 15 * time.Millisecond
	case sht3xSingleMedium, sht3xSingleMedStretch:
		dur = 6 * time.Millisecond
	case sht3xSingleLow, sht3xSingleLowStretch:
		dur = 4 * time.Millisecond
	case sht3xSoftReset:
		c.powerOn()
		c.resetAt = time.Now()
		return nil
	case sht3xReadStatus:
		c.out = sensirionWords(c.status)
		c.ready, c.stretch = time.Time{}, false
		return nil
	case sht3xClearStatus:
		c.status &^= sht3xStatusAlert | sht3xStatusRHAlert | sht3xStatusTAlert | sht3xStatusReset
		return nil
	case sht3xHeaterOn:
		c.status |= sht3xStatusHeater
		return nil
	case sht3xHeaterOff:
		c.status &^= sht3xStatusHeater
		return nil
	case sht3xBreak:
		return nil
	default:
		return refusal(fmt.Sprintf("unknown command 0x%04x", cmd))
	}
	t, h := uint16(0xFFFF), uint16(0xFFFF)
	if !x.outOfRange {
		v := x.values()
		t = sht3xRaw((v.Temperature + 45) / 175)
		h = sht3xRaw(v.Humidity / 100)
	}
	c.out = sensirionWords(t, h)
	c.ready = time.Now().Add(dur)
	c.stretch = cmd>>8 == 0x2C
	return nil
}

// sht3xRaw scales a fraction of the chip's range to its 16-bit word.
func sht3xRaw(f float64) uint16 {
	return uint16(math.Round(clamp(f, 0, 1) * 65535))
}

// sensirionWords encodes words as the chip sends them: each big-endian,
// followed by its CRC.
func sensirionWords(words ...uint16) []byte {
	b := make([]byte, 0, 3*len(words))
	for _, v := range words {
		b = append(b, byte(v>>8), byte(v))
		b = append(b, crc8(b[len(b)-2:]))
	}
	return b
}

// crc8 is the checksum Sensirion chips send after each 16-bit word:
// CRC-8 with polynomial 0x31, initial value 0xFF, no reflection and no
// final XOR (SHT3x datasheet 4.12).
func crc8(data []byte) byte {
	crc := byte(0xFF)
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
