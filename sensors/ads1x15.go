package sensors

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/ads1x15"
)

// Kinds ads1115 and ads1015: Texas Instruments' four-input ADCs (16 and 12
// bits), read in single-shot mode through periph's ads1x15 driver: each
// configured channel is one conversion per Read, and the chip powers down
// between conversions.
//
// Options:
//
//	max_voltage  the largest input, in volts, that picks the gain: the
//	             smallest full scale (0.256, 0.512, 1.024, 2.048, 4.096 or
//	             6.144 V) that holds it (default 4.096)
//	data_rate    samples per second of each conversion (default 128)
//
// Each channel is one quantity: its input is A0..A3 against ground, or a
// differential pair; its volts are scaled linearly from→to when both are
// set, and its plausible range is the channel's range, or else the image
// of ±max_voltage.

// The kinds this file drives, listed in the table in kinds.go.
var (
	ads1115Kind = Kind{
		Name:      "ads1115",
		Doc:       "Texas Instruments ADS1115 16-bit four-input ADC",
		Bus:       BusI2C,
		Addresses: ads1x15Addresses,
		Channels:  true,
		Parse:     func(s *Spec) Opener { return parseADS1x15(s, ads1115Rates) },
	}
	ads1015Kind = Kind{
		Name:      "ads1015",
		Doc:       "Texas Instruments ADS1015 12-bit four-input ADC",
		Bus:       BusI2C,
		Addresses: ads1x15Addresses,
		Channels:  true,
		Parse:     func(s *Spec) Opener { return parseADS1x15(s, ads1015Rates) },
	}
)

// ads1x15Addresses are set by wiring the ADDR pin to GND, VDD, SDA or SCL.
var ads1x15Addresses = []uint16{0x48, 0x49, 0x4a, 0x4b}

// The data rates each chip converts at, in samples per second. The
// default, 128, is the slowest rate both share: a slower conversion
// averages away more noise, and even four of them take only 32 ms.
var (
	ads1115Rates = []string{"8", "16", "32", "64", "128", "250", "475", "860"}
	ads1015Rates = []string{"128", "250", "490", "920", "1600", "2400", "3300"}
)

// ads1x15Inputs are the multiplexer settings, by the input names channels use.
var ads1x15Inputs = []struct {
	name string
	mux  ads1x15.Channel
}{
	{"A0", ads1x15.Channel0},
	{"A1", ads1x15.Channel1},
	{"A2", ads1x15.Channel2},
	{"A3", ads1x15.Channel3},
	{"A0-A1", ads1x15.Channel0Minus1},
	{"A0-A3", ads1x15.Channel0Minus3},
	{"A1-A3", ads1x15.Channel1Minus3},
	{"A2-A3", ads1x15.Channel2Minus3},
}

// Registers, selected by the pointer byte.
const (
	ads1x15RegConversion = 0x00
	ads1x15RegConfig     = 0x01
	ads1x15ConfigIdle    = 0x80 // OS, bit 15 of config: reads 1 when no conversion is running
)

// ads1x15Input is one configured channel.
type ads1x15Input struct {
	mux           ads1x15.Channel
	scale, offset float64 // value = volts*scale + offset
}

func parseADS1x15(s *Spec, rates []string) Opener {
	maxV := s.Float("max_voltage", 4.096, 0.256, 6.144)
	rate, _ := strconv.Atoi(s.Choice("data_rate", "128", rates...)) // every choice is a number
	if len(s.Channels) == 0 {
		s.Fail("channels", "required: at least one input, such as {name: level, input: A0}")
	}
	ins := make([]ads1x15Input, 0, len(s.Channels))
	qs := make([]Quantity, 0, len(s.Channels))
	for i, ch := range s.Channels {
		in := ads1x15Input{mux: -1, scale: 1}
		for _, c := range ads1x15Inputs {
			if c.name == ch.Input {
				in.mux = c.mux
			}
		}
		// An empty input is already reported by the configuration's checks.
		if in.mux < 0 && ch.Input != "" {
			names := make([]string, len(ads1x15Inputs))
			for j, c := range ads1x15Inputs {
				names[j] = c.name
			}
			s.Fail(fmt.Sprintf("channels[%d].input", i), "%q is not an input of the %s; use one of %s", ch.Input, s.Kind, strings.Join(names, ", "))
		}
		// A malformed scale is also reported by the configuration's checks.
		if len(ch.From) == 2 && len(ch.To) == 2 && ch.From[0] != ch.From[1] {
			in.scale = (ch.To[1] - ch.To[0]) / (ch.From[1] - ch.From[0])
			in.offset = ch.To[0] - ch.From[0]*in.scale
		}
		q := Quantity{Name: ch.Name, Unit: ch.Unit, Decimals: ch.Decimals, Class: ch.Class}
		if q.Unit == "" {
			q.Unit = "V"
		}
		if len(ch.Range) == 2 {
			q.Min, q.Max = ch.Range[0], ch.Range[1]
		} else {
			a, b := -maxV*in.scale+in.offset, maxV*in.scale+in.offset
			q.Min, q.Max = min(a, b), max(a, b)
		}
		ins = append(ins, in)
		qs = append(qs, q)
	}
	kind, addr := s.Kind, s.Addr
	s.Quantities = qs // known from the channels: discovery need not wait for the chip
	return func(c Conn) (Device, error) { return openADS1x15(c.I2C, kind, addr, maxV, rate, ins, qs) }
}

// ads1x15Dev is an opened ADS1115 or ADS1015.
type ads1x15Dev struct {
	name   string
	addr   uint16
	bus    *periphBus
	dev    *ads1x15.Dev
	pins   []ads1x15.PinADC
	ins    []ads1x15Input
	qs     []Quantity
	closed bool
}

func openADS1x15(bus i2c.Bus, kind string, addr uint16, maxV float64, rate int, ins []ads1x15Input, qs []Quantity) (Device, error) {
	d := &ads1x15Dev{name: kind, addr: addr, bus: &periphBus{Bus: bus}, ins: ins, qs: qs}
	// periph's constructors do not touch the bus; read the config register
	// so that a missing chip is reported at open, as other kinds do.
	var cfg [2]byte
	if err := bus.Tx(addr, []byte{ads1x15RegConfig}, cfg[:]); err != nil {
		return nil, fmt.Errorf("sensors: %s: %w", d, err)
	}
	period := time.Second / time.Duration(rate)
	rb := &ads1x15ReadyBus{periphBus: d.bus, addr: addr, poll: period / 10}
	opts := ads1x15.Opts{I2cAddress: addr}
	var err error
	if kind == "ads1015" {
		d.dev, err = ads1x15.NewADS1015(rb, &opts)
	} else {
		d.dev, err = ads1x15.NewADS1115(rb, &opts)
	}
	if err != nil {
		return nil, fmt.Errorf("sensors: %s: %w", d, err)
	}
	fullScale := physic.ElectricPotential(math.Round(maxV * float64(physic.Volt)))
	for i, in := range ins {
		// BestQuality picks the slowest rate at least as fast as asked:
		// exactly the configured one.
		p, err := d.dev.PinForChannel(in.mux, fullScale, physic.Frequency(rate)*physic.Hertz, ads1x15.BestQuality)
		if err != nil {
			return nil, fmt.Errorf("sensors: %s: channel %s: %w", d, qs[i].Name, err)
		}
		d.pins = append(d.pins, p)
	}
	return d, nil
}

// Quantities returns one quantity per configured channel, in order.
func (d *ads1x15Dev) Quantities() []Quantity { return d.qs }

// Read converts each channel in turn. periph sleeps one conversion time per
// channel without looking at ctx; the bus checks ctx before each
// transaction.
func (d *ads1x15Dev) Read(ctx context.Context, vals []float64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	d.bus.begin(ctx)
	for i, p := range d.pins {
		smp, err := p.Read()
		if err != nil {
			return fmt.Errorf("sensors: %s: read %s: %w", d, d.qs[i].Name, d.bus.end(err))
		}
		vals[i] = float64(smp.V)/float64(physic.Volt)*d.ins[i].scale + d.ins[i].offset
	}
	d.bus.end(nil)
	if err := dropImplausible(d.qs, vals); err != nil {
		return fmt.Errorf("sensors: %s: %w", d, err)
	}
	return nil
}

// Close releases the chip. In single-shot mode it powers down after every
// conversion, so periph's Halt has nothing to send.
func (d *ads1x15Dev) Close() error {
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
func (d *ads1x15Dev) String() string { return fmt.Sprintf("%s at 0x%02x", d.name, d.addr) }

// errADS1x15Busy is returned when a conversion outlasts twice its nominal time.
var errADS1x15Busy = errors.New("conversion still running after twice its nominal time")

// ads1x15ReadyBus makes periph wait for the end of a conversion before it
// reads the result. periph sleeps exactly one nominal conversion time
// (1/data rate), but the chip's internal oscillator lets the data rate
// vary by up to ±10% (ADS1115 datasheet, electrical characteristics), so
// a slow chip may still be converting; the conversion register then holds
// the previous result, which may be another input's. Before passing on a
// read of the conversion register, it polls the config register's OS bit.
type ads1x15ReadyBus struct {
	*periphBus
	addr uint16
	poll time.Duration // a tenth of one conversion
	ptr  [1]byte
	cfg  [2]byte
}

// Tx passes a transaction on, first waiting for the conversion when it
// reads the result.
func (b *ads1x15ReadyBus) Tx(addr uint16, w, r []byte) error {
	if addr == b.addr && len(w) == 1 && w[0] == ads1x15RegConversion && len(r) == 2 {
		if err := b.wait(); err != nil {
			return err
		}
	}
	return b.periphBus.Tx(addr, w, r)
}

// wait polls until no conversion runs, for up to one more conversion time
// on top of periph's sleep.
func (b *ads1x15ReadyBus) wait() error {
	b.ptr[0] = ads1x15RegConfig
	for i := 0; ; i++ {
		if err := b.periphBus.Tx(b.addr, b.ptr[:], b.cfg[:]); err != nil {
			return err
		}
		if b.cfg[0]&ads1x15ConfigIdle != 0 {
			return nil
		}
		if i == 10 {
			return errADS1x15Busy
		}
		time.Sleep(b.poll)
	}
}
