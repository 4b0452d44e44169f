package sim

import (
	"math"
	"time"
)

// ads1115Chip is a Texas Instruments ADS1115 16-bit ADC. The first byte of a
// write is the pointer (0 conversion, 1 config, 2 and 3 the comparator
// thresholds); two more bytes write that register, big-endian. Reads
// return the pointed register.
//
// In single-shot mode (MODE=1), writing config with OS=1 starts one
// conversion of the input the multiplexer selects, at the gain PGA sets;
// it takes 1/DR in real time, during which config reads with OS=0 and the
// conversion register still holds the previous result. In continuous mode
// the conversion register follows the inputs. The comparator is not
// simulated.
type ads1115Chip struct {
	ptr      byte
	config   uint16
	conv     int16
	lo, hi   uint16
	next     int16 // the result of the running conversion
	started  time.Time
	duration time.Duration
	running  bool
}

// ADS1115 config register fields (datasheet 8.6.3).
const (
	adsConfigDefault = 0x8583
	adsOS            = 1 << 15
	adsModeSingle    = 1 << 8
)

// adsFullScale is the input range, in volts, of each PGA setting.
var adsFullScale = [8]float64{6.144, 4.096, 2.048, 1.024, 0.512, 0.256, 0.256, 0.256}

// adsRates are the data rates, in samples per second, of each DR setting.
var adsRates = [8]int{8, 16, 32, 64, 128, 250, 475, 860}

func (c *ads1115Chip) name() string { return "ADS1115" }

func (c *ads1115Chip) powerOn() {
	*c = ads1115Chip{config: adsConfigDefault, lo: 0x8000, hi: 0x7FFF}
}

func (c *ads1115Chip) tx(x *txCtx, w, r []byte) error {
	c.settle(x)
	if len(w) > 0 {
		c.ptr = w[0] & 3
	}
	if len(w) >= 3 {
		v := uint16(w[1])<<8 | uint16(w[2])
		switch c.ptr {
		case 1:
			c.writeConfig(x, v)
		case 2:
			c.lo = v
		case 3:
			c.hi = v
		}
	}
	if len(r) == 0 {
		return nil
	}
	var v uint16
	switch c.ptr {
	case 0:
		if c.config&adsModeSingle == 0 {
			c.conv = c.convert(x)
		}
		v = uint16(c.conv)
	case 1:
		v = c.config &^ adsOS
		if !c.running {
			v |= adsOS
		}
	case 2:
		v = c.lo
	case 3:
		v = c.hi
	}
	putBE16(r, v)
	return nil
}

func (c *ads1115Chip) writeConfig(x *txCtx, v uint16) {
	c.config = v &^ adsOS
	if v&adsModeSingle != 0 && v&adsOS != 0 && !c.running {
		c.next = c.convert(x)
		c.started = time.Now()
		c.duration = time.Second / time.Duration(adsRates[v>>5&7])
		c.running = true
		c.settle(x)
	}
}

// settle ends a single-shot conversion whose time is up.
func (c *ads1115Chip) settle(x *txCtx) {
	if c.running && !x.busy(c.started, c.duration) {
		c.conv = c.next
		c.running = false
	}
}

// convert returns the code for the input the config selects, now.
func (c *ads1115Chip) convert(x *txCtx) int16 {
	if x.outOfRange {
		return math.MaxInt16
	}
	in := x.values().Inputs
	var volts float64
	switch mux := c.config >> 12 & 7; mux {
	case 0:
		volts = in[0] - in[1]
	case 1:
		volts = in[0] - in[3]
	case 2:
		volts = in[1] - in[3]
	case 3:
		volts = in[2] - in[3]
	default:
		volts = in[mux-4]
	}
	code := math.Round(volts / adsFullScale[c.config>>9&7] * 32768)
	return int16(clamp(code, math.MinInt16, math.MaxInt16))
}
