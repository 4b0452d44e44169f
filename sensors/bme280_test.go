package sensors

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2ctest"
)

// Helpers shared by the tests of the periph-based drivers (bme280,
// ads1x15, ina219).

// drvOpen parses the configuration doc, whose first sensor must be valid,
// and opens that sensor on bus.
func drvOpen(t *testing.T, doc string, bus i2c.Bus) (Device, error) {
	t.Helper()
	ps, open := parseSensorYAML(t, doc, nil)
	if len(ps) > 0 || open == nil {
		t.Fatalf("parse: %v", ps)
	}
	return open(Conn{I2C: bus})
}

// drvNackAt returns the bus drivers get in production (nackBus) over pb,
// where transaction n (from 0, counting open) fails as a Linux adapter
// does when nothing acknowledges.
func drvNackAt(pb *i2ctest.Playback, n int) (i2c.Bus, *faultBus) {
	f := &faultBus{Bus: pb, at: map[int]error{n: errLinuxNack}}
	return nackBus{f}, f
}

// drvWantNoAck checks that err is counted as no answer.
func drvWantNoAck(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrNoAck) || Reason(err) != ReasonNoAck {
		t.Fatalf("err = %v (reason %s); want one wrapping ErrNoAck", err, Reason(err))
	}
}

// drvConsumed checks that every recorded transaction took place.
func drvConsumed(t *testing.T, pb *i2ctest.Playback) {
	t.Helper()
	if err := pb.Close(); err != nil {
		t.Error(err)
	}
}

// drvWantVals compares a reading with want, where NaN means implausible.
func drvWantVals(t *testing.T, got, want []float64) {
	t.Helper()
	for i := range want {
		g, w := got[i], want[i]
		if math.IsNaN(w) != math.IsNaN(g) || !math.IsNaN(w) && math.Abs(g-w) > 1e-9*max(1, math.Abs(w)) {
			t.Errorf("vals = %v; want %v", got, want)
			return
		}
	}
}

// The calibration of the worked example in Bosch's BMP280 datasheet: with it, adc_T 519888 is 25.08 °C and adc_P 415148 is
// 100653.27 Pa by the floating-point formulas. The BME280 uses the same
// registers and formulas.
var bmxExampleCal = []int{
	27504, 26435, -1000, // dig_T1..T3
	36477, -10685, 3024, 2855, 140, -7, 15500, -14600, 6000, // dig_P1..P9
}

const (
	bmxExampleT = 519888
	bmxExampleP = 415148
	// bmxHumRaw reads as 45.5 %RH with bmxHumCal below: with dig_H2 = 256
	// and every other humidity coefficient 0, the datasheet's integer
	// formula reduces to ((adc_H+1)>>1)/128 %, and (11649>>1)/128 = 45.5.
	bmxHumRaw = 11648
)

// bmxCalRegs returns registers 0x88..0xA1 (dig_T1..dig_P9, a reserved
// byte, dig_H1 = 0) and 0xE1..0xE7 (dig_H2 = 256, dig_H3..H6 = 0).
func bmxCalRegs() (tp, h []byte) {
	tp = make([]byte, 26)
	for i, v := range bmxExampleCal {
		binary.LittleEndian.PutUint16(tp[2*i:], uint16(v))
	}
	h = make([]byte, 7)
	binary.LittleEndian.PutUint16(h, 256)
	return tp, h
}

// bmxData returns registers 0xF7..0xFE: 20-bit pressure and temperature
// (MSB, LSB, XLSB[7:4]) and 16-bit humidity; bmp280 reads only six.
func bmxData(p, t, h int, bme bool) []byte {
	b := []byte{byte(p >> 12), byte(p >> 4), byte(p << 4), byte(t >> 12), byte(t >> 4), byte(t << 4), byte(h >> 8), byte(h)}
	if !bme {
		return b[:6]
	}
	return b
}

// bmxOpenOps is the traffic of opening a BME280 (bme) or BMP280 at 0x76
// with oversampling register value osrs for every quantity: the chip id,
// twice (ours, then periph's), the calibration, and the setup. periph
// writes config with t_sb 101 (1 s, used only in normal mode) and the
// filter off; ctrl_meas is osrs_t[7:5] osrs_p[4:2] mode[1:0], sleep = 00.
func bmxOpenOps(id byte, bme bool, osrs byte) []i2ctest.IO {
	tp, h := bmxCalRegs()
	meas := osrs<<5 | osrs<<2
	ops := []i2ctest.IO{
		{Addr: 0x76, W: []byte{0xD0}, R: []byte{id}},
		{Addr: 0x76, W: []byte{0xD0}, R: []byte{id}},
		{Addr: 0x76, W: []byte{0x88}, R: tp},
	}
	if bme {
		return append(ops,
			i2ctest.IO{Addr: 0x76, W: []byte{0xE1}, R: h},
			// ctrl_meas, ctrl_hum, config, then ctrl_meas again: the
			// datasheet wants ctrl_hum confirmed by a ctrl_meas write.
			i2ctest.IO{Addr: 0x76, W: []byte{0xF4, meas, 0xF2, osrs, 0xF5, 0xA0, 0xF4, meas}})
	}
	return append(ops, i2ctest.IO{Addr: 0x76, W: []byte{0xF4, meas, 0xF5, 0xA0, 0xF4, meas}})
}

// bmxReadOps is one forced reading: ctrl_meas with mode 01 (forced), the
// status register polled until measuring (bit 3) clears, then the data.
func bmxReadOps(osrs byte, data []byte) []i2ctest.IO {
	return []i2ctest.IO{
		{Addr: 0x76, W: []byte{0xF4, osrs<<5 | osrs<<2 | 1}},
		{Addr: 0x76, W: []byte{0xF3}, R: []byte{0x08}},
		{Addr: 0x76, W: []byte{0xF3}, R: []byte{0x00}},
		{Addr: 0x76, W: []byte{0xF7}, R: data},
	}
}

// osrs 011 is 4x, the default.
const bmxOsrs4x = 3

func bmxSensor(kind, options string) string {
	return "sensors:\n  - {name: climate, kind: " + kind + ", bus: '1', address: '0x76', interval: 10s" + options + "}\n"
}

func TestBME280Read(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x60, true, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, bmxExampleT, bmxHumRaw, true))...)
	d, err := drvOpen(t, bmxSensor("bme280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range d.Quantities() {
		names = append(names, q.Name+"/"+q.Unit+"/"+q.Class)
	}
	if got := strings.Join(names, " "); got != "temperature/°C/temperature humidity/%/humidity pressure/hPa/pressure" {
		t.Errorf("quantities = %s", got)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	// The datasheet's 64-bit integer pressure formula gives 25767233/256 Pa
	// (100653.254 Pa; the floating-point formula gives 100653.27).
	drvWantVals(t, vals, []float64{25.08, 45.5, 25767233.0 / 256 / 100})
	if err := d.Close(); err != nil {
		t.Error(err)
	}
	drvConsumed(t, pb)
	if got := d.String(); got != "bme280 at 0x76" {
		t.Errorf("String = %q", got)
	}
}

func TestBMP280Read(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x58, false, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, bmxExampleT, 0, false))...)
	d, err := drvOpen(t, bmxSensor("bmp280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.Quantities()); n != 2 {
		t.Fatalf("%d quantities; want temperature and pressure", n)
	}
	vals := make([]float64, 2)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	drvWantVals(t, vals, []float64{25.08, 25767233.0 / 256 / 100})
	drvConsumed(t, pb)
}

func TestBME280Options(t *testing.T) {
	// 16x is osrs 101; filter 8 is 011 in config[4:2], written after
	// periph's setup.
	pb := &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x60, true, 5), i2ctest.IO{Addr: 0x76, W: []byte{0xF5, 0x0C}})
	pb.Ops = append(pb.Ops, bmxReadOps(5, bmxData(bmxExampleP, bmxExampleT, bmxHumRaw, true))...)
	d, err := drvOpen(t, bmxSensor("bme280", ", options: {oversampling: 16x, filter: '8'}"), pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	drvConsumed(t, pb)
}

func TestBME280WrongChip(t *testing.T) {
	for _, tc := range []struct {
		kind string
		id   byte
		want []string
	}{
		{"bme280", 0x58, []string{"a BMP280", "no humidity", "use kind bmp280", "0x76"}},
		{"bmp280", 0x60, []string{"a BME280", "use kind bme280"}},
		{"bme280", 0x55, []string{"a BMP180", "not supported"}},
		{"bmp280", 0x61, []string{"chip id 0x61", "another device"}},
	} {
		pb := &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{{Addr: 0x76, W: []byte{0xD0}, R: []byte{tc.id}}}}
		d, err := drvOpen(t, bmxSensor(tc.kind, ""), pb)
		if d != nil || !errors.Is(err, ErrWrongDevice) || Reason(err) != ReasonWrongDevice {
			t.Errorf("%s with id 0x%02x: %v, %v; want ErrWrongDevice", tc.kind, tc.id, d, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s with id 0x%02x: %q lacks %q", tc.kind, tc.id, err, w)
			}
		}
		drvConsumed(t, pb)
	}
}

func TestBME280ParseProblems(t *testing.T) {
	if ps, open := parseSensorYAML(t, bmxSensor("bme280", ""), nil); len(ps) != 0 || open == nil {
		t.Fatalf("good sensor: %v", ps)
	}
	for _, tc := range []struct {
		options map[string]string
		address string
		path    string
		want    []string
	}{
		{map[string]string{"oversampling": "3x"}, "", "sensors[0].options.oversampling", []string{`"3x" is not allowed`, "1x, 2x, 4x, 8x, 16x"}},
		{map[string]string{"filter": "1"}, "", "sensors[0].options.filter", []string{`"1" is not allowed`, "off, 2, 4, 8, 16"}},
		{map[string]string{"mode": "normal"}, "", "sensors[0].options.mode", []string{"unknown option for bme280", "known options: filter, oversampling"}},
		{nil, "0x40", "sensors[0].address", []string{"0x76 or 0x77, not 0x40"}},
	} {
		ps, _ := parseSensorYAML(t, bmxSensor("bme280", ""), func(sc *Sensor) {
			sc.Options = tc.options
			if tc.address != "" {
				sc.Address = tc.address
			}
		})
		for _, w := range tc.want {
			wantProblem(t, ps, tc.path, w)
		}
	}
}

func TestBME280ReadNack(t *testing.T) {
	// Transaction 5 is the forced-mode trigger, 7 the data read.
	for _, n := range []int{5, 7} {
		ops := append(bmxOpenOps(0x60, true, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, bmxExampleT, bmxHumRaw, true))...)
		pb := &i2ctest.Playback{DontPanic: true, Ops: ops[:n]}
		bus, fb := drvNackAt(pb, n)
		d, err := drvOpen(t, bmxSensor("bme280", ""), bus)
		if err != nil {
			t.Fatal(err)
		}
		vals := make([]float64, 3)
		err = d.Read(context.Background(), vals)
		drvWantNoAck(t, err)
		if !strings.Contains(err.Error(), "bme280 at 0x76") {
			t.Errorf("%q does not name the device", err)
		}
		if fb.n != n+1 {
			t.Errorf("NACK at #%d: read went on to %d transactions: %q", n, fb.n, fb.log)
		}
		drvConsumed(t, pb)
	}
}

func TestBME280OpenNack(t *testing.T) {
	// The calibration read, inside periph, which keeps only the error's text.
	pb := &i2ctest.Playback{DontPanic: true, Ops: bmxOpenOps(0x60, true, bmxOsrs4x)[:2]}
	bus, _ := drvNackAt(pb, 2)
	_, err := drvOpen(t, bmxSensor("bme280", ""), bus)
	drvWantNoAck(t, err)
}

func TestBME280Implausible(t *testing.T) {
	// adc_T 0xFFFFF is 187.55 °C; with it, adc_P 415148 is 1251.6 hPa and
	// adc_P 0xFFFFF below zero. Humidity does not depend on temperature
	// with this calibration and stays plausible.
	pb := &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x60, true, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, 0xFFFFF, bmxHumRaw, true))...)
	d, err := drvOpen(t, bmxSensor("bme280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatalf("one plausible value left: %v", err)
	}
	drvWantVals(t, vals, []float64{math.NaN(), 45.5, math.NaN()})

	pb = &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x58, false, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(0xFFFFF, 0xFFFFF, 0, false))...)
	d, err = drvOpen(t, bmxSensor("bmp280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	vals = vals[:2]
	err = d.Read(context.Background(), vals)
	if !errors.Is(err, ErrImplausible) || Reason(err) != ReasonImplausible || !strings.Contains(err.Error(), "temperature 187.55°C outside -40..85") {
		t.Fatalf("err = %v; want ErrImplausible naming the temperature", err)
	}
	drvWantVals(t, vals, []float64{math.NaN(), math.NaN()})
}

func TestBME280ReadContext(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true}
	pb.Ops = append(bmxOpenOps(0x60, true, bmxOsrs4x), bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, bmxExampleT, bmxHumRaw, true))...)
	d, err := drvOpen(t, bmxSensor("bme280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Read(ctx, vals); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: err = %v", err)
	}
	if pb.Count != 5 {
		t.Errorf("done context: %d transactions after open; want none", pb.Count-5)
	}
	// The deadline passes during periph's 26 ms conversion wait: the
	// status poll after it is refused.
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	err = d.Read(ctx, vals)
	if !errors.Is(err, context.DeadlineExceeded) || Reason(err) != ReasonTimeout {
		t.Errorf("deadline during the conversion: err = %v (reason %s)", err, Reason(err))
	}
	if pb.Count != 6 {
		t.Errorf("deadline during the conversion: %d transactions after open; want only the trigger", pb.Count-5)
	}
}

func TestBME280ReadAllocs(t *testing.T) {
	const runs = 5
	pb := &i2ctest.Playback{DontPanic: true, Ops: bmxOpenOps(0x60, true, bmxOsrs4x)}
	for range runs + 1 { // AllocsPerRun reads once more to warm up
		pb.Ops = append(pb.Ops, bmxReadOps(bmxOsrs4x, bmxData(bmxExampleP, bmxExampleT, bmxHumRaw, true))...)
	}
	d, err := drvOpen(t, bmxSensor("bme280", ""), pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(runs, func() {
		if err := d.Read(ctx, vals); err != nil {
			t.Fatal(err)
		}
	})
	// Our side allocates nothing; periph's Sense builds each write and
	// read buffer as a fresh slice that escapes through the conn.Conn
	// interface: the trigger write, then the register byte and the result
	// of each read (two status polls and the data here), 7 in all; a chip
	// that is idle at the first poll costs 5.
	if allocs > 7 {
		t.Errorf("Read allocates %.0f times; periph's Sense accounts for 7", allocs)
	}
	t.Logf("Read: %.0f allocations, all in periph's bmxx80", allocs)
	drvConsumed(t, pb)
}
