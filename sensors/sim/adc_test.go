package sim

import (
	"testing"
	"time"

	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/ads1x15"
	"periph.io/x/devices/v3/ina219"
)

// TestSimADS1115ThroughPeriph reads every input, and a differential pair,
// through periph's ads1x15 driver at two gains and expects the world's
// voltages to within one code.
func TestSimADS1115ThroughPeriph(t *testing.T) {
	w, clk := newTestWorld(t, 9)
	adc, err := ads1x15.NewADS1115(w.I2C(), &ads1x15.DefaultOpts)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ch   ads1x15.Channel
		fs   physic.ElectricPotential
		want func(v Values) float64
	}{
		{ads1x15.Channel0, 2048 * physic.MilliVolt, func(v Values) float64 { return v.Inputs[0] }},
		{ads1x15.Channel1, 4096 * physic.MilliVolt, func(v Values) float64 { return v.Inputs[1] }},
		{ads1x15.Channel2, 256 * physic.MilliVolt, func(v Values) float64 { return v.Inputs[2] }},
		{ads1x15.Channel3, 256 * physic.MilliVolt, func(v Values) float64 { return v.Inputs[3] }},
		{ads1x15.Channel0Minus1, 4096 * physic.MilliVolt, func(v Values) float64 { return v.Inputs[0] - v.Inputs[1] }},
	} {
		p, err := adc.PinForChannel(tc.ch, tc.fs, 860*physic.Hertz, ads1x15.BestQuality)
		if err != nil {
			t.Fatal(err)
		}
		lsb := float64(tc.fs) / float64(physic.Volt) / 32768
		for range 3 {
			clk.Add(13 * time.Minute)
			want := tc.want(w.Values())
			s, err := p.Read()
			if err != nil {
				t.Fatal(err)
			}
			got := float64(s.V) / float64(physic.Volt)
			if !near(got, want, lsb) {
				t.Errorf("%s at ±%s: %.6f V (raw %d), want %.6f V ± %.6f", p, tc.fs, got, s.Raw, want, lsb)
			}
		}
	}
}

// TestSimADS1115Conversion checks the OS bit and the conversion time that
// a driver polling for the end of a conversion relies on.
func TestSimADS1115Conversion(t *testing.T) {
	w, _ := newTestWorld(t, 9)
	bus := w.I2C()
	cfg := make([]byte, 2)
	if err := bus.Tx(AddrADS1115, []byte{1}, cfg); err != nil {
		t.Fatal(err)
	}
	if cfg[0] != 0x85 || cfg[1] != 0x83 {
		t.Errorf("config after power-on % x, want 85 83", cfg)
	}
	// A1, ±4.096 V, single shot, 8 samples/s: 125 ms.
	start := time.Now()
	if err := bus.Tx(AddrADS1115, []byte{1, 0xD3, 0x03}, nil); err != nil {
		t.Fatal(err)
	}
	conv := make([]byte, 2)
	if err := bus.Tx(AddrADS1115, []byte{1}, cfg); err != nil {
		t.Fatal(err)
	}
	if err := bus.Tx(AddrADS1115, []byte{0}, conv); err != nil {
		t.Fatal(err)
	}
	if cfg[0]&0x80 != 0 || conv[0] != 0 || conv[1] != 0 {
		t.Errorf("right after the start: config % x, conversion % x; want OS 0 and the old result 0", cfg, conv)
	}
	for {
		if err := bus.Tx(AddrADS1115, []byte{1}, cfg); err != nil {
			t.Fatal(err)
		}
		if cfg[0]&0x80 != 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if el := time.Since(start); el < 125*time.Millisecond || el > time.Second {
		t.Errorf("conversion at 8 SPS took %s, want 125 ms", el)
	}
	if err := bus.Tx(AddrADS1115, []byte{0}, conv); err != nil {
		t.Fatal(err)
	}
	want := w.Values().Inputs[1]
	if got := float64(int16(uint16(conv[0])<<8|uint16(conv[1]))) * 4.096 / 32768; !near(got, want, 4.096/32768) {
		t.Errorf("A1 %.5f V, want %.5f", got, want)
	}
}

// TestSimINA219ThroughPeriph reads the power monitor through periph's
// ina219 driver: shunt within 10 µV, bus within 4 mV, current and power
// within what the register arithmetic loses.
func TestSimINA219ThroughPeriph(t *testing.T) {
	w, clk := newTestWorld(t, 4)
	dev, err := ina219.New(w.I2C(), &ina219.Opts{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		clk.Add(47 * time.Minute)
		v := w.Values()
		pm, err := dev.Sense()
		if err != nil {
			t.Fatal(err)
		}
		shunt := float64(pm.Shunt) / float64(physic.Volt)
		bus := float64(pm.Voltage) / float64(physic.Volt)
		current := float64(pm.Current) / float64(physic.Ampere)
		power := float64(pm.Power) / float64(physic.Watt)
		wantBus := v.Battery - v.Load*LoadShunt
		if !near(shunt, v.Load*LoadShunt, 5e-6) || !near(bus, wantBus, 2e-3) ||
			!near(current, v.Load, 3e-4) || !near(power, wantBus*v.Load, 5e-3) {
			t.Errorf("%v; want shunt %.5f V, bus %.3f V, current %.4f A, power %.3f W",
				pm, v.Load*LoadShunt, wantBus, v.Load, wantBus*v.Load)
		}
		if bus < 11.8 || bus > 13.8 || current < 0.4 || current > 0.6 {
			t.Errorf("%v is not a 12 V bus with about 0.5 A", pm)
		}
	}
}
