package sensors

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"periph.io/x/conn/v3/i2c/i2ctest"
)

// adsDoc is an ADS1115 at 0x48 with a supply voltage on A0 and a 4–20 mA
// pressure transmitter across a 100 Ω shunt between A2 and A3.
const adsDoc = `sensors:
  - name: analog
    kind: ads1115
    bus: "1"
    address: "0x48"
    interval: 10s
    channels:
      - {name: supply, input: A0}
      - {name: tank, input: A2-A3, unit: bar, from: [0.4, 2.0], to: [0, 10], decimals: 2, class: pressure}
`

// adsStart is the config register write that starts one single-shot
// conversion: OS[15] = 1 (start), MUX[14:12], PGA[11:9], MODE[8] = 1
// (single shot), DR[7:5], COMP_QUE[1:0] = 11 (comparator off).
func adsStart(mux, pga, dr uint16) i2ctest.IO {
	v := 1<<15 | mux<<12 | pga<<9 | 1<<8 | dr<<5 | 3
	return i2ctest.IO{Addr: 0x48, W: []byte{0x01, byte(v >> 8), byte(v)}}
}

// adsStatus is a read of the config register: OS reads 1 once the
// conversion is done, 0 while it runs.
func adsStatus(done bool) i2ctest.IO {
	b := byte(0x03)
	if done {
		b |= 0x80
	}
	return i2ctest.IO{Addr: 0x48, W: []byte{0x01}, R: []byte{b, 0x83}}
}

// adsResult is a read of the conversion register.
func adsResult(raw int16) i2ctest.IO {
	return i2ctest.IO{Addr: 0x48, W: []byte{0x00}, R: []byte{byte(uint16(raw) >> 8), byte(raw)}}
}

// MUX values, PGA 001 (±4.096 V) and the ADS1115's DR 100 (128 SPS).
const (
	adsMuxA0   = 4 // 100: AIN0 against GND
	adsMuxA1   = 5
	adsMuxA2A3 = 3 // 011: AIN2 − AIN3
	adsPGA4V   = 1
	adsDR128   = 4
)

// adsOpenOps is open's presence check: a read of the config register,
// here at its power-on value 0x8583.
var adsOpenOps = []i2ctest.IO{{Addr: 0x48, W: []byte{0x01}, R: []byte{0x85, 0x83}}}

// adsReadOps is one good reading of adsDoc: A0 at 16000 counts (2.0 V
// at ±4.096 V full scale), the conversion still running at the first
// poll; A2−A3 at 9600 counts (1.2 V, 5 bar on the 0.4–2.0 V scale).
func adsReadOps() []i2ctest.IO {
	return []i2ctest.IO{
		adsStart(adsMuxA0, adsPGA4V, adsDR128), adsStatus(false), adsStatus(true), adsResult(16000),
		adsStart(adsMuxA2A3, adsPGA4V, adsDR128), adsStatus(true), adsResult(9600),
	}
}

func TestADS1115Read(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, adsReadOps())}
	d, err := drvOpen(t, adsDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	qs := d.Quantities()
	// 0.4–2.0 V to 0–10 bar is 6.25 bar/V − 2.5 bar: ±4.096 V is −28.1..23.1 bar.
	want := []Quantity{
		{Name: "supply", Unit: "V", Decimals: 3, Min: -4.096, Max: 4.096},
		{Name: "tank", Unit: "bar", Decimals: 2, Min: -28.1, Max: 23.1, Class: "pressure"},
	}
	if len(qs) != len(want) {
		t.Fatalf("quantities = %+v", qs)
	}
	for i, q := range qs {
		w := want[i]
		if q.Name != w.Name || q.Unit != w.Unit || q.Decimals != w.Decimals || q.Class != w.Class ||
			math.Abs(q.Min-w.Min) > 1e-9 || math.Abs(q.Max-w.Max) > 1e-9 {
			t.Errorf("quantity %d = %+v; want %+v", i, q, w)
		}
	}
	vals := make([]float64, 2)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	drvWantVals(t, vals, []float64{2.0, 5.0})
	if err := d.Close(); err != nil {
		t.Error(err)
	}
	drvConsumed(t, pb)
	if got := d.String(); got != "ads1115 at 0x48" {
		t.Errorf("String = %q", got)
	}
}

func TestADS1015Read(t *testing.T) {
	// max_voltage 2.048 is PGA 010; the ADS1015's 128 SPS is DR 000. Its
	// 12-bit result is left-aligned: 1000 counts read as 16000, 1.0 V.
	const doc = `sensors:
  - name: analog
    kind: ads1015
    bus: "1"
    address: "0x48"
    interval: 10s
    options: {max_voltage: "2.048"}
    channels: [{name: level, input: A1, range: [0, 2]}]
`
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, []i2ctest.IO{adsStart(adsMuxA1, 2, 0), adsStatus(true), adsResult(16000)})}
	d, err := drvOpen(t, doc, pb)
	if err != nil {
		t.Fatal(err)
	}
	if q := d.Quantities()[0]; q.Min != 0 || q.Max != 2 {
		t.Errorf("range = %g..%g; want the channel's 0..2", q.Min, q.Max)
	}
	vals := make([]float64, 1)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatal(err)
	}
	drvWantVals(t, vals, []float64{1.0})
	drvConsumed(t, pb)
}

func TestADS1x15ParseProblems(t *testing.T) {
	if ps, open := parseSensorYAML(t, adsDoc, nil); len(ps) != 0 || open == nil {
		t.Fatalf("good sensor: %v", ps)
	}
	for _, tc := range []struct {
		name string
		edit func(*Sensor)
		path string
		want []string
	}{
		{"no channels", func(sc *Sensor) { sc.Channels = nil }, "sensors[0].channels", []string{"at least one input"}},
		{"input", func(sc *Sensor) { sc.Channels[1].Input = "A3-A2" }, "sensors[0].channels[1].input",
			[]string{`"A3-A2" is not an input of the ads1115`, "A0, A1, A2, A3, A0-A1, A0-A3, A1-A3, A2-A3"}},
		{"max_voltage", withOptions(map[string]string{"max_voltage": "7"}), "sensors[0].options.max_voltage", []string{"from 0.256 to 6.144"}},
		{"data_rate", withOptions(map[string]string{"data_rate": "3300"}), "sensors[0].options.data_rate", []string{"8, 16, 32, 64, 128, 250, 475, 860"}},
		{"ads1015 data_rate", func(sc *Sensor) { sc.Kind = "ads1015"; sc.Options = map[string]string{"data_rate": "860"} },
			"sensors[0].options.data_rate", []string{"128, 250, 490, 920, 1600, 2400, 3300"}},
		{"unknown", withOptions(map[string]string{"gain": "1"}), "sensors[0].options.gain", []string{"known options: data_rate, max_voltage"}},
	} {
		ps, _ := parseSensorYAML(t, adsDoc, tc.edit)
		for _, w := range tc.want {
			wantProblem(t, ps, tc.path, w)
		}
	}
	// 3300 is one of the ADS1015's rates.
	ps, _ := parseSensorYAML(t, adsDoc, func(sc *Sensor) { sc.Kind = "ads1015"; sc.Options = map[string]string{"data_rate": "3300"} })
	if len(ps) != 0 {
		t.Errorf("ads1015 at 3300 SPS: %v", ps)
	}
}

func TestADS1115ReadNack(t *testing.T) {
	// Transactions: 0 open, 1–4 A0, 5 start A2−A3, 6 its status, 7 its result.
	for _, n := range []int{5, 7} {
		all := ops(adsOpenOps, adsReadOps())
		pb := &i2ctest.Playback{DontPanic: true, Ops: all[:n]}
		bus, fb := drvNackAt(pb, n)
		d, err := drvOpen(t, adsDoc, bus)
		if err != nil {
			t.Fatal(err)
		}
		err = d.Read(context.Background(), make([]float64, 2))
		drvWantNoAck(t, err)
		if !strings.Contains(err.Error(), "ads1115 at 0x48: read tank") {
			t.Errorf("%q does not name the device and channel", err)
		}
		if fb.n != n+1 {
			t.Errorf("NACK at #%d: read went on to %d transactions: %q", n, fb.n, fb.log)
		}
		drvConsumed(t, pb)
	}
}

func TestADS1115Implausible(t *testing.T) {
	// 0 V on the tank is −2.5 bar, outside its range of 0..10; the supply
	// is still good, so the reading is.
	doc := strings.Replace(adsDoc, "class: pressure}", "class: pressure, range: [0, 10]}", 1)
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, []i2ctest.IO{
		adsStart(adsMuxA0, adsPGA4V, adsDR128), adsStatus(true), adsResult(16000),
		adsStart(adsMuxA2A3, adsPGA4V, adsDR128), adsStatus(true), adsResult(0),
	})}
	d, err := drvOpen(t, doc, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 2)
	if err := d.Read(context.Background(), vals); err != nil {
		t.Fatalf("one plausible value left: %v", err)
	}
	drvWantVals(t, vals, []float64{2.0, math.NaN()})

	// Full scale, 4.096 V, on a channel said to see at most 3.3 V.
	const single = `sensors:
  - {name: analog, kind: ads1115, bus: "1", address: "0x48", interval: 10s, options: {max_voltage: "3.3"}, channels: [{name: supply, input: A0}]}
`
	pb = &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, []i2ctest.IO{adsStart(adsMuxA0, adsPGA4V, adsDR128), adsStatus(true), adsResult(32767)})}
	d, err = drvOpen(t, single, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals = vals[:1]
	err = d.Read(context.Background(), vals)
	if !errors.Is(err, ErrImplausible) || Reason(err) != ReasonImplausible || !strings.Contains(err.Error(), "supply 4.09") || !strings.Contains(err.Error(), "outside -3.3..3.3") {
		t.Fatalf("err = %v; want ErrImplausible naming the supply", err)
	}
	drvWantVals(t, vals, []float64{math.NaN()})
}

func TestADS1115ConversionNeverEnds(t *testing.T) {
	// At 860 SPS (DR 111) the status is polled 11 times, 116 µs apart.
	const doc = `sensors:
  - {name: analog, kind: ads1115, bus: "1", address: "0x48", interval: 10s, options: {data_rate: "860"}, channels: [{name: supply, input: A0}]}
`
	io := []i2ctest.IO{adsStart(adsMuxA0, adsPGA4V, 7)}
	for range 11 {
		io = append(io, adsStatus(false))
	}
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, io)}
	d, err := drvOpen(t, doc, pb)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Read(context.Background(), make([]float64, 1)); !errors.Is(err, errADS1x15Busy) {
		t.Errorf("err = %v; want errADS1x15Busy", err)
	}
	drvConsumed(t, pb)
}

func TestADS1115ReadContext(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(adsOpenOps, adsReadOps())}
	d, err := drvOpen(t, adsDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Read(ctx, make([]float64, 2)); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v; want context.Canceled", err)
	}
	if pb.Count != len(adsOpenOps) {
		t.Errorf("%d transactions after open; want none", pb.Count-len(adsOpenOps))
	}
}

func TestADS1115ReadAllocs(t *testing.T) {
	const runs = 10
	pb := &i2ctest.Playback{DontPanic: true, Ops: adsOpenOps}
	for range runs + 1 { // AllocsPerRun reads once more to warm up
		pb.Ops = ops(pb.Ops, adsReadOps())
	}
	d, err := drvOpen(t, adsDoc, pb)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float64, 2)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(runs, func() {
		if err := d.Read(ctx, vals); err != nil {
			t.Fatal(err)
		}
	})
	// Our side allocates nothing; periph's conversion builds its register
	// pointer and its result buffer as fresh slices that escape through
	// the i2c.Dev: two per channel.
	if allocs > 4 {
		t.Errorf("Read of two channels allocates %.0f times; periph accounts for 4", allocs)
	}
	t.Logf("Read of two channels: %.0f allocations, all in periph's ads1x15", allocs)
	drvConsumed(t, pb)
}
