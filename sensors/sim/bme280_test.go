package sim

import (
	"strings"
	"testing"
	"time"

	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/bmxx80"
)

// TestSimBME280ThroughPeriph reads the fake through periph's bmxx80 driver
// (NewI2C, then Sense in forced mode) at several times of day and
// oversamplings, and expects the world's values to within the driver's
// resolution: its output steps (0.01 °C, 1/256 Pa, 1/1024 %) plus half
// the ADC's step at the oversampling (datasheet tables 6 and 7: 2.62 Pa
// at 1x, 0.66 Pa at 4x, 0.16 Pa at 16x) and a little for the
// temperature's step, which the pressure is compensated with.
func TestSimBME280ThroughPeriph(t *testing.T) {
	for _, tc := range []struct {
		name    string
		os      bmxx80.Oversampling
		instant bool
		tolP    float64 // hPa
	}{
		{"1x", bmxx80.O1x, true, 0.015},
		{"4x in real time", bmxx80.O4x, false, 0.004},
		{"16x", bmxx80.O16x, true, 0.0012},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.instant {
				opts = append(opts, WithInstant())
			}
			w, clk := newTestWorld(t, 11, opts...)
			dev, err := bmxx80.NewI2C(w.I2C(), AddrBME280, &bmxx80.Opts{Temperature: tc.os, Pressure: tc.os, Humidity: tc.os})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(dev.String(), "BME280") {
				t.Errorf("periph identifies %s, want a BME280", dev)
			}
			var last physic.Env
			for i := range 6 {
				clk.Add(3*time.Hour + 7*time.Minute)
				want := w.Values()
				var e physic.Env
				if err := dev.Sense(&e); err != nil {
					t.Fatal(err)
				}
				gotT := float64(e.Temperature-physic.ZeroCelsius) / float64(physic.Celsius)
				gotP := float64(e.Pressure) / float64(physic.Pascal) / 100
				gotH := float64(e.Humidity) / float64(physic.PercentRH)
				if !near(gotT, want.Temperature, 0.01) || !near(gotP, want.Pressure, tc.tolP) || !near(gotH, want.Humidity, 0.01) {
					t.Errorf("reading %d: %.4f °C %.4f hPa %.4f %%, want %.4f °C %.4f hPa %.4f %%",
						i, gotT, gotP, gotH, want.Temperature, want.Pressure, want.Humidity)
				}
				if i > 0 && e == last {
					t.Errorf("reading %d repeats the previous one: %v", i, e)
				}
				last = e
			}
		})
	}
}

// TestSimBME280Registers checks the register behaviour drivers rely on
// beyond periph's sequence.
func TestSimBME280Registers(t *testing.T) {
	w, _ := newTestWorld(t, 1)
	bus := w.I2C()
	read := func(reg byte, n int) []byte {
		t.Helper()
		r := make([]byte, n)
		if err := bus.Tx(AddrBME280, []byte{reg}, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	write := func(b ...byte) {
		t.Helper()
		if err := bus.Tx(AddrBME280, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if id := read(0xD0, 1)[0]; id != 0x60 {
		t.Fatalf("chip id 0x%02x, want 0x60", id)
	}
	// The calibration parses back to the trimming, including the split
	// nibbles of dig_H4 and dig_H5.
	c1, c2 := read(0x88, 26), read(0xE1, 7)
	if t1 := uint16(c1[0]) | uint16(c1[1])<<8; t1 != bme280Trim.t1 {
		t.Errorf("dig_T1 %d, want %d", t1, bme280Trim.t1)
	}
	if p9 := int16(uint16(c1[22]) | uint16(c1[23])<<8); p9 != bme280Trim.p9 {
		t.Errorf("dig_P9 %d, want %d", p9, bme280Trim.p9)
	}
	if h1 := c1[25]; h1 != bme280Trim.h1 {
		t.Errorf("dig_H1 %d, want %d", h1, bme280Trim.h1)
	}
	h4 := int16(c2[3])<<4 | int16(c2[4]&0x0F)
	h5 := int16(c2[4])>>4 | int16(c2[5])<<4
	if h4 != bme280Trim.h4 || h5 != bme280Trim.h5 || int8(c2[6]) != bme280Trim.h6 {
		t.Errorf("dig_H4 %d dig_H5 %d dig_H6 %d, want %d %d %d", h4, h5, int8(c2[6]), bme280Trim.h4, bme280Trim.h5, bme280Trim.h6)
	}
	// Before any measurement the data registers hold the reset values.
	if d := read(0xF7, 8); d[0] != 0x80 || d[3] != 0x80 || d[6] != 0x80 || d[7] != 0 {
		t.Errorf("data after power-on % x, want 80 00 00 80 00 00 80 00", d)
	}

	// osrs_h takes effect only with the next write to ctrl_meas.
	write(0xF2, 1)
	if got := read(0xF2, 1)[0]; got != 1 {
		t.Errorf("ctrl_hum reads %d after writing 1", got)
	}
	write(0xF4, 0x25) // T 1x, P 1x, forced
	start := time.Now()
	if st := read(0xF3, 1)[0]; st&0x08 == 0 {
		t.Error("status does not show measuring right after a forced start")
	}
	if d := read(0xF7, 8); d[3] != 0x80 || d[4] != 0 {
		t.Errorf("data changed while measuring: % x", d)
	}
	for read(0xF3, 1)[0]&0x08 != 0 {
		if time.Since(start) > time.Second {
			t.Fatal("still measuring after 1 s")
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(start); el < 5*time.Millisecond {
		t.Errorf("measurement took %s; the datasheet's typical time for 1x is 5.5 ms", el)
	}
	d := read(0xF7, 8)
	if d[3] == 0x80 && d[4] == 0 || d[6] == 0x80 && d[7] == 0 {
		t.Errorf("data after the measurement % x still holds reset values", d)
	}
	if m := read(0xF4, 1)[0]; m&3 != 0 {
		t.Errorf("mode %d after a forced measurement, want sleep", m&3)
	}

	// Humidity skipped: its register reads 0x8000.
	w2, _ := newTestWorld(t, 1, WithInstant())
	bus = w2.I2C()
	if err := bus.Tx(AddrBME280, []byte{0xF4, 0x25}, nil); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, 8)
	if err := bus.Tx(AddrBME280, []byte{0xF7}, r); err != nil {
		t.Fatal(err)
	}
	if r[6] != 0x80 || r[7] != 0 || r[3] == 0x80 && r[4] == 0 {
		t.Errorf("with osrs_h 0: % x, want humidity 80 00 and a temperature", r)
	}
	// Soft reset returns every control register to zero.
	if err := bus.Tx(AddrBME280, []byte{0xF2, 5, 0xF5, 0x10, 0xE0, 0xB6}, nil); err != nil {
		t.Fatal(err)
	}
	if err := bus.Tx(AddrBME280, []byte{0xF2}, r[:4]); err != nil {
		t.Fatal(err)
	}
	if r[0] != 0 || r[2] != 0 || r[3] != 0 {
		t.Errorf("ctrl_hum, ctrl_meas, config after reset: % x, want zeros", r[:4])
	}
}

// TestSimBME280Inversion checks the inversion on its own over the range
// of plausible weather: the compensation of the raw values it picks lands
// within one output step of the target.
func TestSimBME280Inversion(t *testing.T) {
	cal := &bme280Trim
	for temp := -40.0; temp <= 85; temp += 6.25 {
		raw := invertMonotonic(0, bme280MaxRaw20, 1, func(r int32) int64 { return int64(cal.tFine(r)) }, int64(temp*5120))
		tf := cal.tFine(raw)
		if got := float64((tf*5+128)>>8) / 100; !near(got, temp, 0.01) {
			t.Errorf("%g °C: raw %d compensates to %g", temp, raw, got)
		}
		for _, hpa := range []float64{300, 950, 1013.25, 1100} {
			p := invertMonotonic(0, bme280MaxRaw20, 1, func(r int32) int64 { return cal.pressure64(r, tf) }, int64(hpa*25600))
			if got := float64(cal.pressure(p, tf)) / 25600; !near(got, hpa, 0.01) {
				t.Errorf("%g °C %g hPa: raw %d compensates to %g", temp, hpa, p, got)
			}
		}
		for _, rh := range []float64{0, 35, 70, 100} {
			h := invertMonotonic(0, bme280MaxRaw16, 1, func(r int32) int64 { return int64(cal.humidity(r, tf)) }, int64(rh*1024))
			if got := float64(cal.humidity(h, tf)) / 1024; !near(got, rh, 0.01) {
				t.Errorf("%g °C %g %%: raw %d compensates to %g", temp, rh, h, got)
			}
		}
	}
}
