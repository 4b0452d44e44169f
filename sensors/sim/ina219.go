package sim

import "math"

// ina219Chip is a Texas Instruments INA219 on the high side of the battery
// feed: the shunt (LoadShunt) carries the load current, and the bus
// voltage is the battery's less the drop across the shunt. Registers are
// 16 bits, big-endian, selected by the first byte of a write.
//
// The chip converts continuously; shunt and bus registers follow the
// world at every read, and the current and power registers derive from
// them through the calibration register as the datasheet (8.5) says.
// Conversion times, averaging and the triggered and power-down modes are
// not simulated.
type ina219Chip struct {
	ptr    byte
	config uint16
	cal    uint16
}

// INA219 registers and fields.
const (
	inaRegConfig  = 0
	inaRegShunt   = 1
	inaRegBus     = 2
	inaRegPower   = 3
	inaRegCurrent = 4
	inaRegCal     = 5

	inaConfigDefault = 0x399F
	inaReset         = 1 << 15
	inaBRNG          = 1 << 13 // bus range 32 V; 16 V when clear
	inaCNVR          = 1 << 1  // conversion ready, in the bus register
	inaOVF           = 1 << 0  // math overflow, in the bus register
)

func (c *ina219Chip) name() string { return "INA219" }

func (c *ina219Chip) powerOn() { *c = ina219Chip{config: inaConfigDefault} }

func (c *ina219Chip) tx(x *txCtx, w, r []byte) error {
	if len(w) > 0 {
		c.ptr = w[0]
	}
	if len(w) >= 3 {
		v := uint16(w[1])<<8 | uint16(w[2])
		switch c.ptr {
		case inaRegConfig:
			if v&inaReset != 0 {
				c.powerOn()
			} else {
				c.config = v
			}
		case inaRegCal:
			c.cal = v &^ 1 // bit 0 is void and reads 0
		}
	}
	if len(r) == 0 {
		return nil
	}
	var v uint16
	switch c.ptr {
	case inaRegConfig:
		v = c.config
	case inaRegCal:
		v = c.cal
	default:
		shunt, bus, ovf := c.convert(x)
		current := int16(clamp(math.Trunc(float64(shunt)*float64(c.cal)/4096), math.MinInt16, math.MaxInt16))
		switch c.ptr {
		case inaRegShunt:
			v = uint16(shunt)
		case inaRegBus:
			v = bus<<3 | inaCNVR
			if ovf || math.Abs(float64(shunt)*float64(c.cal)/4096) > math.MaxInt16 {
				v |= inaOVF
			}
		case inaRegCurrent:
			v = uint16(current)
		case inaRegPower:
			v = uint16(min(math.Abs(float64(current))*float64(bus)/5000, math.MaxUint16))
		}
	}
	putBE16(r, v)
	return nil
}

// convert returns the shunt register (10 µV a count, clipped to the PGA's
// range), the bus voltage in 4 mV counts (clipped to BRNG's range) and
// whether a value overflowed.
func (c *ina219Chip) convert(x *txCtx) (shunt int16, bus uint16, ovf bool) {
	// PG gives ±40 mV times 1, 2, 4 or 8.
	limit := 4000 << (c.config >> 11 & 3)
	v := x.values()
	s := math.Round(v.Load * LoadShunt / 10e-6)
	if x.outOfRange {
		s = float64(limit) + 1
	}
	ovf = math.Abs(s) > float64(limit)
	rng := 16.0
	if c.config&inaBRNG != 0 {
		rng = 32
	}
	b := math.Round(clamp(v.Battery-v.Load*LoadShunt, 0, rng) / 4e-3)
	return int16(clamp(s, float64(-limit), float64(limit))), uint16(b), ovf
}
