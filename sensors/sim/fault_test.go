package sim

import (
	"strings"
	"testing"
	"time"

	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/ads1x15"
	"periph.io/x/devices/v3/bmxx80"
	"periph.io/x/devices/v3/ina219"
)

func TestSimFaultNACK(t *testing.T) {
	w, _ := newTestWorld(t, 1)
	bus := w.I2C()
	id := make([]byte, 1)
	w.NACK(AddrBME280, 2)
	for range 2 {
		wantNACK(t, bus.Tx(AddrBME280, []byte{0xD0}, id), "a NACK was injected")
		if err := bus.Tx(AddrADS1115, []byte{1}, make([]byte, 2)); err != nil {
			t.Errorf("another address fails too: %v", err)
		}
	}
	if err := bus.Tx(AddrBME280, []byte{0xD0}, id); err != nil || id[0] != 0x60 {
		t.Errorf("third transaction: id 0x%02x, %v; want 0x60", id[0], err)
	}
	// An injected NACK also hits an empty address.
	w.NACK(0x50, 1)
	wantNACK(t, bus.Tx(0x50, nil, id), "a NACK was injected")
	wantNACK(t, bus.Tx(0x50, nil, id), "no device")
}

func TestSimFaultBadCRC(t *testing.T) {
	w, _ := newTestWorld(t, 1, WithInstant())
	bus := w.I2C()
	measure := func() []byte {
		t.Helper()
		r := make([]byte, 6)
		if err := bus.Tx(AddrSHT3x, []byte{0x24, 0x00}, nil); err != nil {
			t.Fatal(err)
		}
		if err := bus.Tx(AddrSHT3x, nil, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	w.BadCRC(2)
	for i := range 2 {
		r := measure()
		if r[2] == crc8(r[0:2]) || r[5] == crc8(r[3:5]) {
			t.Errorf("read %d after BadCRC(2): % x carries a right CRC", i, r)
		}
	}
	r := measure()
	shtRead(t, r) // fails on a wrong CRC
}

func TestSimFaultOutOfRange(t *testing.T) {
	w, _ := newTestWorld(t, 1, WithInstant())
	bus := w.I2C()
	for _, a := range []uint16{AddrBME280, AddrSHT3x, AddrADS1115, AddrINA219} {
		if err := w.OutOfRange(a, true); err != nil {
			t.Fatal(err)
		}
	}
	// BME280 through periph: far above the chip's 85 °C.
	bme, err := bmxx80.NewI2C(bus, AddrBME280, &bmxx80.DefaultOpts)
	if err != nil {
		t.Fatal(err)
	}
	var e physic.Env
	if err := bme.Sense(&e); err != nil {
		t.Fatal(err)
	}
	if c := float64(e.Temperature-physic.ZeroCelsius) / float64(physic.Celsius); c < 100 {
		t.Errorf("out-of-range BME280 reads %.2f °C, want well above 85", c)
	}
	// SHT3x: 0xffff with good CRCs is 130 °C.
	if err := bus.Tx(AddrSHT3x, []byte{0x24, 0x00}, nil); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, 6)
	if err := bus.Tx(AddrSHT3x, nil, r); err != nil {
		t.Fatal(err)
	}
	if temp, hum := shtRead(t, r); temp != 130 || hum != 100 {
		t.Errorf("out-of-range SHT3x reads %g °C %g %%, want 130 and 100", temp, hum)
	}
	// ADS1115: full scale.
	adc, _ := ads1x15.NewADS1115(bus, &ads1x15.DefaultOpts)
	p, err := adc.PinForChannel(ads1x15.Channel0, 2048*physic.MilliVolt, 860*physic.Hertz, ads1x15.BestQuality)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := p.Read(); err != nil || s.Raw != 32767 {
		t.Errorf("out-of-range ADS1115 reads %v, %v; want raw 32767", s, err)
	}
	// INA219: periph reports the overflow flag.
	ina, err := ina219.New(bus, &ina219.Opts{})
	if err != nil {
		t.Fatal(err)
	}
	if pm, err := ina.Sense(); err == nil || !strings.Contains(err.Error(), "overflow") {
		t.Errorf("out-of-range INA219: %v, %v; want the overflow error", pm, err)
	}

	// Back to normal.
	for _, a := range w.Addresses() {
		if err := w.OutOfRange(a, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := bme.Sense(&e); err != nil {
		t.Fatal(err)
	}
	if c := float64(e.Temperature-physic.ZeroCelsius) / float64(physic.Celsius); !near(c, w.Values().Temperature, 0.01) {
		t.Errorf("BME280 back to normal reads %.2f °C, want %.2f", c, w.Values().Temperature)
	}
	if _, err := ina.Sense(); err != nil {
		t.Errorf("INA219 back to normal: %v", err)
	}
	if err := w.OutOfRange(0x50, true); err == nil || !strings.Contains(err.Error(), "0x50") {
		t.Errorf("OutOfRange on an empty address: %v, want an error naming it", err)
	}
}

func TestSimFaultRemoveAndReplug(t *testing.T) {
	w, clk := newTestWorld(t, 1)
	bus := w.I2C()
	ina, err := ina219.New(bus, &ina219.Opts{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SetPresent(AddrINA219, false); err != nil {
		t.Fatal(err)
	}
	wantNACK(t, bus.Tx(AddrINA219, nil, make([]byte, 1)), "INA219 removed")
	if _, err := ina.Sense(); err == nil {
		t.Error("Sense on a removed INA219 succeeded")
	}
	clk.Add(time.Minute)
	if err := w.SetPresent(AddrINA219, true); err != nil {
		t.Fatal(err)
	}
	// Plugged in again, it has lost its calibration: no current.
	pm, err := ina.Sense()
	if err != nil {
		t.Fatal(err)
	}
	if pm.Current != 0 || pm.Voltage < 11*physic.Volt {
		t.Errorf("replugged INA219 reads %v; want the bus voltage and no current until calibrated", pm)
	}
	cal := make([]byte, 2)
	if err := bus.Tx(AddrINA219, []byte{5}, cal); err != nil || cal[0] != 0 || cal[1] != 0 {
		t.Errorf("calibration after replug % x, %v; want 0", cal, err)
	}
	if err := w.SetPresent(0x23, false); err == nil {
		t.Error("SetPresent on an empty address succeeded")
	}
}
