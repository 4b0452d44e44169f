package sensors

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"periph.io/x/conn/v3/i2c/i2ctest"
)

const inaDoc = "sensors:\n  - {name: battery, kind: ina219, bus: '1', address: '0x40', interval: 10s}\n"

// inaReg is a read of 16-bit register reg.
func inaReg(reg byte, v uint16) i2ctest.IO {
	return i2ctest.IO{Addr: 0x40, W: []byte{reg}, R: []byte{byte(v >> 8), byte(v)}}
}

// inaWrite is a write of 16-bit register reg.
func inaWrite(reg byte, v uint16) i2ctest.IO {
	return i2ctest.IO{Addr: 0x40, W: []byte{reg, byte(v >> 8), byte(v)}}
}

// inaOpenOps is opening with calibration value cal: the calibration
// register (0x05); periph's configuration 0x1FFF (BRNG 0, the 16 V range;
// PG /8; 128-sample averaging of bus and shunt; continuous); then ours,
// the same with BRNG 1 for the 32 V range.
func inaOpenOps(cal uint16) []i2ctest.IO {
	return []i2ctest.IO{inaWrite(0x05, cal), inaWrite(0x00, 0x1fff), inaWrite(0x00, 0x3fff)}
}

// With the defaults, 0.1 Ω and 3.2 A, the datasheet's calibration is
// trunc(0.04096 / (3.2 A/32768 × 0.1 Ω)) = trunc(4194.3) = 4194.
const inaDefaultCal = 4194

// inaReadOps is one reading: the shunt (0x01), bus (0x02), current (0x04)
// and power (0x03) registers, in the order periph reads them.
func inaReadOps(shunt, bus, current, power uint16) []i2ctest.IO {
	return []i2ctest.IO{inaReg(0x01, shunt), inaReg(0x02, bus), inaReg(0x04, current), inaReg(0x03, power)}
}

// inaBus is the bus voltage register for mV millivolts: 4 mV per step
// from bit 3, with CNVR (bit 1, conversion ready) set.
func inaBus(mV int) uint16 { return uint16(mV/4)<<3 | 2 }

// A good reading at the defaults: 100 mV on the shunt (10 µV steps), 12 V
// on the bus, current register 10240 and power register 6144 (the
// datasheet's current × bus / 5000, 10240 × 3000 / 5000). periph's current
// step is 3.2 A/32768 truncated to whole nanoamperes, 97656 nA, so 10240
// steps are 0.99999744 A; its power step is 20 current steps rounded,
// 1953125 nW, so 6144 steps are 12 W.
var inaGoodRead = inaReadOps(10000, inaBus(12000), 10240, 6144)

func TestINA219Read(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(inaOpenOps(inaDefaultCal), inaGoodRead, []i2ctest.IO{inaWrite(0x00, 0x3ff8)})}
	d, err := drvOpen(t, inaDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range d.Quantities() {
		got = append(got, q.Name+"/"+q.Unit+"/"+q.Class)
	}
	if s := strings.Join(got, " "); s != "voltage/V/voltage current/A/current power/W/power" {
		t.Errorf("quantities = %s", s)
	}
	// ±3.2 A × 1.1, and up to 26 V times that.
	qs := d.Quantities()
	if math.Abs(qs[1].Min+3.52) > 1e-9 || math.Abs(qs[1].Max-3.52) > 1e-9 || math.Abs(qs[2].Max-91.52) > 1e-9 || qs[0].Max != 26 {
		t.Errorf("ranges = %+v", qs)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	drvWantVals(t, vals, []float64{12, 0.99999744, 12})
	// Close powers down: mode bits 000.
	if err := d.Close(); err != nil {
		t.Error(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	drvConsumed(t, pb)
	if s := d.String(); s != "ina219 at 0x40" {
		t.Errorf("String = %q", s)
	}
}

func TestINA219Options(t *testing.T) {
	// 0.01 Ω and 10 A: trunc(0.04096 / (10 A/32768 × 0.01 Ω)) = 13421.
	doc := strings.Replace(inaDoc, "interval: 10s", "interval: 10s, options: {shunt_ohms: '0.01', max_current: '10'}", 1)
	pb := &i2ctest.Playback{DontPanic: true, Ops: inaOpenOps(13421)}
	d, err := drvOpen(t, doc, pb)
	if err != nil {
		t.Fatal(err)
	}
	if q := d.Quantities()[1]; math.Abs(q.Max-11) > 1e-9 {
		t.Errorf("current up to %g A; want 11", q.Max)
	}
	drvConsumed(t, pb)
}

func TestINA219ParseProblems(t *testing.T) {
	if ps, open := parseSensorYAML(t, inaDoc, nil); len(ps) != 0 || open == nil {
		t.Fatalf("good sensor: %v", ps)
	}
	for _, tc := range []struct {
		opts map[string]string
		path string
		want []string
	}{
		{map[string]string{"shunt_ohms": "0"}, "sensors[0].options.shunt_ohms", []string{`"0" is not allowed`, "from 0.001 to 10"}},
		{map[string]string{"max_current": "lots"}, "sensors[0].options.max_current", []string{`"lots" is not allowed`}},
		// 1 A across 1 Ω is 1 V, beyond the shunt input's 320 mV.
		{map[string]string{"shunt_ohms": "1", "max_current": "1"}, "sensors[0].options.max_current", []string{"is 1 V", "from 0.0205 to 0.32 A"}},
		// 1 A across 1 mΩ is 1 mV: the calibration would not fit 16 bits.
		{map[string]string{"shunt_ohms": "0.001", "max_current": "1"}, "sensors[0].options.max_current", []string{"is 0.001 V", "from 20.5 to 320 A"}},
		{map[string]string{"gain": "8"}, "sensors[0].options.gain", []string{"known options: max_current, shunt_ohms"}},
		// With max_current left out, the shunt written is what is wrong.
		{map[string]string{"shunt_ohms": "1"}, "sensors[0].options.shunt_ohms", []string{"3.2 A (the default max_current) across 1 Ω is 3.2 V", "from 0.0205 to 0.32 A"}},
	} {
		ps, _ := parseSensorYAML(t, inaDoc, withOptions(tc.opts))
		for _, w := range tc.want {
			wantProblem(t, ps, tc.path, w)
		}
	}
}

func TestINA219ReadNack(t *testing.T) {
	// Transactions: 0–2 open, 3 shunt, 4 bus, 5 current. periph replaces a
	// bus error with its own; the NACK must survive anyway.
	all := ops(inaOpenOps(inaDefaultCal), inaGoodRead)
	pb := &i2ctest.Playback{DontPanic: true, Ops: all[:5]}
	bus, fb := drvNackAt(pb, 5)
	d, err := drvOpen(t, inaDoc, bus)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Read(context.Background(), make([]float64, 3))
	drvWantNoAck(t, err)
	if !strings.Contains(err.Error(), "ina219 at 0x40") {
		t.Errorf("%q does not name the device", err)
	}
	if fb.n != 6 {
		t.Errorf("read went on to %d transactions: %q", fb.n, fb.log)
	}
	drvConsumed(t, pb)
}

func TestINA219OpenNack(t *testing.T) {
	// periph reports a failed configuration write without its cause.
	pb := &i2ctest.Playback{DontPanic: true, Ops: inaOpenOps(inaDefaultCal)[:1]}
	bus, _ := drvNackAt(pb, 1)
	_, err := drvOpen(t, inaDoc, bus)
	drvWantNoAck(t, err)
}

func TestINA219Implausible(t *testing.T) {
	// 28 V is above the chip's 26 V, and power register 49152 is 96 W,
	// above 26 V × 3.52 A; the current is still good.
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(inaOpenOps(inaDefaultCal), inaReadOps(10000, inaBus(28000), 10240, 49152))}
	d, err := drvOpen(t, inaDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatalf("one plausible value left: %v", err)
	}
	drvWantVals(t, vals, []float64{math.NaN(), 0.99999744, math.NaN()})
	drvConsumed(t, pb)
}

func TestINA219Overflow(t *testing.T) {
	// OVF (bit 0 of the bus voltage register): current and power are out
	// of range and periph stops reading; the bus voltage is good.
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(inaOpenOps(inaDefaultCal), []i2ctest.IO{inaReg(0x01, 0x7d00), inaReg(0x02, inaBus(12000)|1)})}
	d, err := drvOpen(t, inaDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatalf("bus voltage left: %v", err)
	}
	drvWantVals(t, vals, []float64{12, math.NaN(), math.NaN()})
	drvConsumed(t, pb)
}

func TestINA219ReadContext(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(inaOpenOps(inaDefaultCal), inaGoodRead)}
	d, err := drvOpen(t, inaDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	// Right after open the first conversion cycle is still running; a
	// read whose deadline passes while it waits reports a timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	err = d.Read(ctx, make([]float64, 3))
	if !errors.Is(err, context.DeadlineExceeded) || Reason(err) != ReasonTimeout {
		t.Errorf("err = %v (reason %s); want a timeout", err, Reason(err))
	}
	if pb.Count != 3 {
		t.Errorf("%d transactions after open; want none", pb.Count-3)
	}
}

func TestINA219ReadAllocs(t *testing.T) {
	const runs = 10
	pb := &i2ctest.Playback{DontPanic: true, Ops: inaOpenOps(inaDefaultCal)}
	for range runs + 1 { // AllocsPerRun reads once more to warm up
		pb.Ops = ops(pb.Ops, inaGoodRead)
	}
	d, err := drvOpen(t, inaDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 3)
	ctx := context.Background()
	if err := d.Read(ctx, vals); err != nil { // waits out the first conversion
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(runs-1, func() {
		if err := d.Read(ctx, vals); err != nil {
			t.Fatal(err)
		}
	})
	// Our side allocates nothing; periph's mmr register reads build the
	// register pointer and the 2-byte result as fresh slices that escape
	// through the conn.Conn interface: two for each of four registers.
	if allocs > 8 {
		t.Errorf("Read allocates %.0f times; periph accounts for 8", allocs)
	}
	t.Logf("Read: %.0f allocations, all in periph's ina219 (mmr)", allocs)
	drvConsumed(t, pb)
}
