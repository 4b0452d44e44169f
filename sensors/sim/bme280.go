package sim

import (
	"math"
	"time"
)

// bme280Chip is a Bosch BME280 on I²C. Writes are (register, value) pairs; a
// lone register byte sets the pointer that reads start from, and reads
// auto-increment. Raw readings are found by inverting the datasheet's
// compensation formulas (section 4.2.3) over the chip's own trimming
// values, so that a driver applying them gets the world's values back to
// within their resolution.
type bme280Chip struct {
	ptr      byte
	ctrlHum  byte // 0xF2, osrs_h
	ctrlMeas byte // 0xF4: osrs_t[7:5] osrs_p[4:2] mode[1:0]
	config   byte // 0xF5: t_sb[7:5] filter[4:2] spi3w_en[0]
	humOS    byte // osrs_h as latched by the last write to ctrl_meas

	// The data registers 0xF7..0xFE as raw ADC values, and the
	// measurement that will replace them when it ends.
	rawP, rawT, rawH int32
	next             *bme280Sample
	started          time.Time
	measuring        time.Duration
	iirP, iirT       float64 // IIR filter state, in raw counts
	iirPrimed        bool
}

type bme280Sample struct{ p, t, h int32 }

const (
	bme280ChipID      = 0x60
	bme280ResetWord   = 0xB6
	bme280SkippedTP   = 0x80000 // a data register's value when its measurement is skipped
	bme280SkippedH    = 0x8000
	bme280ModeNormal  = 3
	bme280StatusMeas  = 1 << 3
	bme280MaxRaw20    = 1<<20 - 1
	bme280MaxRaw16    = 1<<16 - 1
	bme280RegCalib1   = 0x88
	bme280RegCalib2   = 0xE1
	bme280RegChipID   = 0xD0
	bme280RegReset    = 0xE0
	bme280RegCtrlHum  = 0xF2
	bme280RegStatus   = 0xF3
	bme280RegCtrlMeas = 0xF4
	bme280RegConfig   = 0xF5
	bme280RegData     = 0xF7
)

// bme280Trim is the chip's trimming: dig_T1..dig_H6, in the ranges real
// chips carry (the T and P values are the datasheet's example).
var bme280Trim = bme280Cal{
	t1: 27504, t2: 26435, t3: -1000,
	p1: 36477, p2: -10685, p3: 3024, p4: 2855, p5: 140, p6: -7, p7: 15500, p8: -14600, p9: 6000,
	h1: 75, h2: 362, h3: 0, h4: 313, h5: 50, h6: 30,
}

// bme280Cal holds the trimming parameters under the datasheet's names.
type bme280Cal struct {
	t1                             uint16
	t2, t3                         int16
	p1                             uint16
	p2, p3, p4, p5, p6, p7, p8, p9 int16
	h1, h3                         uint8
	h2, h4, h5                     int16
	h6                             int8
}

func (c *bme280Chip) name() string { return "BME280" }

func (c *bme280Chip) powerOn() {
	*c = bme280Chip{rawP: bme280SkippedTP, rawT: bme280SkippedTP, rawH: bme280SkippedH}
}

func (c *bme280Chip) tx(x *txCtx, w, r []byte) error {
	c.settle(x)
	if len(w) > 0 {
		c.ptr = w[0]
		for i := 0; i+1 < len(w); i += 2 {
			c.write(x, w[i], w[i+1])
		}
		if len(w)%2 == 1 {
			c.ptr = w[len(w)-1]
		}
	}
	if len(r) > 0 && c.ctrlMeas&3 == bme280ModeNormal {
		// Free-running: the data registers hold the latest conversion,
		// which is the world now.
		s := c.measure(x)
		c.rawP, c.rawT, c.rawH = s.p, s.t, s.h
	}
	for i := range r {
		r[i] = c.read(c.ptr)
		c.ptr++
	}
	return nil
}

// settle ends a forced measurement whose time is up: its results become
// visible in the data registers.
func (c *bme280Chip) settle(x *txCtx) {
	if c.next != nil && !x.busy(c.started, c.measuring) {
		c.rawP, c.rawT, c.rawH = c.next.p, c.next.t, c.next.h
		c.next = nil
	}
}

func (c *bme280Chip) write(x *txCtx, reg, v byte) {
	switch reg {
	case bme280RegReset:
		if v == bme280ResetWord {
			c.powerOn()
		}
	case bme280RegCtrlHum:
		c.ctrlHum = v & 0x07
	case bme280RegCtrlMeas:
		// A change of osrs_h takes effect only with a write to ctrl_meas
		// (datasheet 5.4.3).
		c.ctrlMeas = v
		c.humOS = c.ctrlHum
		if m := v & 3; m == 1 || m == 2 {
			c.startForced(x)
		}
	case bme280RegConfig:
		// In normal mode the chip may ignore writes to config (5.4.6);
		// this one always does.
		if c.ctrlMeas&3 != bme280ModeNormal {
			c.config = v &^ 0x02
		}
	}
}

// startForced takes one measurement now; the chip shows it when its
// typical measurement time (datasheet 9.1) has passed, then sleeps.
func (c *bme280Chip) startForced(x *txCtx) {
	s := c.measure(x)
	c.next = &s
	c.started = time.Now()
	osT, osP, osH := oversampling(c.ctrlMeas>>5), oversampling(c.ctrlMeas>>2), oversampling(c.humOS)
	us := 1000 + 2000*osT
	if osP > 0 {
		us += 2000*osP + 500
	}
	if osH > 0 {
		us += 2000*osH + 500
	}
	c.measuring = time.Duration(us) * time.Microsecond
	c.ctrlMeas &^= 3 // back to sleep mode when done
	c.settle(x)
}

// oversampling is the number of samples an osrs_x field asks for.
func oversampling(field byte) int {
	switch f := field & 7; f {
	case 0:
		return 0
	case 1, 2, 3, 4:
		return 1 << (f - 1)
	}
	return 16
}

// measure converts the world's values at the transaction's time into
// raw readings, as the chip's ADCs would give them with its current
// settings.
func (c *bme280Chip) measure(x *txCtx) bme280Sample {
	if x.outOfRange {
		// All ones, as a chip whose data registers are stuck reads.
		return bme280Sample{p: bme280MaxRaw20, t: bme280MaxRaw20, h: bme280MaxRaw16}
	}
	v := x.values()
	osT, osP, osH := oversampling(c.ctrlMeas>>5), oversampling(c.ctrlMeas>>2), oversampling(c.humOS)
	filter := int(c.config>>2) & 7
	s := bme280Sample{p: bme280SkippedTP, t: bme280SkippedTP, h: bme280SkippedH}
	if osT == 0 {
		// Without temperature there is no t_fine; the others are
		// compensated against garbage, as on the chip.
		return s
	}
	// With the IIR filter off, T and P have 16 + (osrs - 1) bits; the
	// low bits of the 20 are zero (datasheet 3.4.2, 3.4.3).
	step := func(os int) int32 {
		if filter != 0 {
			return 1
		}
		bits := 16 + int(math.Log2(float64(os)))
		return 1 << (20 - bits)
	}
	cal := &bme280Trim
	s.t = invertMonotonic(0, bme280MaxRaw20, step(osT), func(raw int32) int64 {
		return int64(cal.tFine(raw))
	}, int64(math.Round(v.Temperature*5120)))
	if osP > 0 {
		tFine := cal.tFine(s.t)
		s.p = invertMonotonic(0, bme280MaxRaw20, step(osP), func(raw int32) int64 {
			return cal.pressure64(raw, tFine)
		}, int64(math.Round(v.Pressure*100*256)))
	}
	if osH > 0 {
		tFine := cal.tFine(s.t)
		s.h = invertMonotonic(0, bme280MaxRaw16, 1, func(raw int32) int64 {
			return int64(cal.humidity(raw, tFine))
		}, int64(math.Round(v.Humidity*1024)))
	}
	if filter != 0 {
		s.t, s.p = c.iir(filter, s.t, s.p)
	}
	return s
}

// iir applies the chip's IIR filter to T and P: each output moves
// 1/coefficient of the way to the new sample (datasheet 3.4.4).
func (c *bme280Chip) iir(filter int, t, p int32) (int32, int32) {
	coef := float64(int(1) << min(filter, 4))
	if !c.iirPrimed {
		c.iirT, c.iirP, c.iirPrimed = float64(t), float64(p), true
	} else {
		c.iirT += (float64(t) - c.iirT) / coef
		c.iirP += (float64(p) - c.iirP) / coef
	}
	return int32(math.Round(c.iirT)), int32(math.Round(c.iirP))
}

func (c *bme280Chip) read(reg byte) byte {
	switch {
	case reg == bme280RegChipID:
		return bme280ChipID
	case reg >= bme280RegCalib1 && reg <= 0xA1:
		return bme280Trim.bytes1()[reg-bme280RegCalib1]
	case reg >= bme280RegCalib2 && reg <= 0xE7:
		return bme280Trim.bytes2()[reg-bme280RegCalib2]
	case reg == bme280RegCtrlHum:
		return c.ctrlHum
	case reg == bme280RegStatus:
		if c.next != nil {
			return bme280StatusMeas
		}
		return 0
	case reg == bme280RegCtrlMeas:
		return c.ctrlMeas
	case reg == bme280RegConfig:
		return c.config
	case reg >= bme280RegData && reg <= 0xFE:
		d := [8]byte{
			byte(c.rawP >> 12), byte(c.rawP >> 4), byte(c.rawP<<4) & 0xF0,
			byte(c.rawT >> 12), byte(c.rawT >> 4), byte(c.rawT<<4) & 0xF0,
			byte(c.rawH >> 8), byte(c.rawH),
		}
		return d[reg-bme280RegData]
	}
	return 0
}

// bytes1 is the trimming as it reads from 0x88..0xA1: little-endian
// words dig_T1..dig_P9, a reserved byte, dig_H1.
func (k *bme280Cal) bytes1() [26]byte {
	var b [26]byte
	words := []uint16{k.t1, uint16(k.t2), uint16(k.t3), k.p1, uint16(k.p2), uint16(k.p3), uint16(k.p4),
		uint16(k.p5), uint16(k.p6), uint16(k.p7), uint16(k.p8), uint16(k.p9)}
	for i, v := range words {
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	b[25] = k.h1
	return b
}

// bytes2 is the trimming as it reads from 0xE1..0xE7: dig_H2, dig_H3,
// then dig_H4 and dig_H5 as 12-bit values sharing the nibbles of 0xE5.
func (k *bme280Cal) bytes2() [7]byte {
	return [7]byte{
		byte(k.h2), byte(uint16(k.h2) >> 8),
		k.h3,
		byte(k.h4 >> 4), byte(k.h4&0x0F) | byte(k.h5&0x0F)<<4, byte(k.h5 >> 4),
		byte(k.h6),
	}
}

// The datasheet's integer compensation (section 8.2), written out here to
// invert it.

// tFine is the fine temperature, in 1/5120 °C, for raw temperature adcT.
func (k *bme280Cal) tFine(adcT int32) int32 {
	t1 := int32(k.t1)
	a := ((adcT >> 3) - t1<<1) * int32(k.t2) >> 11
	d := (adcT >> 4) - t1
	b := ((d * d) >> 12) * int32(k.t3) >> 14
	return a + b
}

// pressure is the pressure in Pa·256 for raw pressure adcP, as the
// chip's users compute it: pressure64 cut to 32 bits.
func (k *bme280Cal) pressure(adcP, tFine int32) uint32 {
	return uint32(k.pressure64(adcP, tFine))
}

// pressure64 is the datasheet's 64-bit pressure compensation before the
// final conversion to 32 bits, which wraps outside the chip's range; the
// inversion searches over this monotonic form.
func (k *bme280Cal) pressure64(adcP, tFine int32) int64 {
	a := int64(tFine) - 128000
	b := a * a * int64(k.p6)
	b += (a * int64(k.p5)) << 17
	b += int64(k.p4) << 35
	a = (a*a*int64(k.p3))>>8 + (a*int64(k.p2))<<12
	a = ((int64(1)<<47 + a) * int64(k.p1)) >> 33
	if a == 0 {
		return 0 // the chip's answer instead of dividing by zero
	}
	p := int64(1048576 - adcP)
	p = ((p<<31 - b) * 3125) / a
	a = (int64(k.p9) * (p >> 13) * (p >> 13)) >> 25
	b = (int64(k.p8) * p) >> 19
	return (p+a+b)>>8 + int64(k.p7)<<4
}

// humidity is the relative humidity in %·1024 for raw humidity adcH.
func (k *bme280Cal) humidity(adcH, tFine int32) uint32 {
	x := tFine - 76800
	u := (adcH<<14 - int32(k.h4)<<20 - int32(k.h5)*x + 16384) >> 15
	s := ((x*int32(k.h6))>>10*((x*int32(k.h3))>>11+32768))>>10 + 2097152
	x = u * ((s*int32(k.h2) + 8192) >> 14)
	x -= (((x >> 15) * (x >> 15)) >> 7) * int32(k.h1) >> 4
	x = min(max(x, 0), 419430400)
	return uint32(x >> 12)
}

// invertMonotonic finds, among lo, lo+step, ... up to hi, the input whose
// f is closest to target, for f monotonic (rising or falling) over the
// range, by bisection.
func invertMonotonic(lo, hi, step int32, f func(int32) int64, target int64) int32 {
	n := (hi - lo) / step // indices 0..n
	at := func(i int32) int64 { return f(lo + i*step) }
	rising := at(n) >= at(0)
	// The first index whose value is at or past target.
	a, b := int32(0), n
	past := func(i int32) bool {
		if rising {
			return at(i) >= target
		}
		return at(i) <= target
	}
	if !past(b) {
		return lo + b*step
	}
	for a < b {
		m := a + (b-a)/2
		if past(m) {
			b = m
		} else {
			a = m + 1
		}
	}
	if a > 0 && abs64(at(a-1)-target) < abs64(at(a)-target) {
		a--
	}
	return lo + a*step
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
