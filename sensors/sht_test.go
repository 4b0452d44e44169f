package sensors

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/sensors/sim"
	"periph.io/x/conn/v3/i2c/i2ctest"
	"periph.io/x/conn/v3/physic"
)

// parseSensorYAML parses doc, a configuration whose first sensor is valid,
// applies edit (when not nil) to that sensor and checks it with parse, as
// the poller does; it returns the problems found and the opener.
func parseSensorYAML(t *testing.T, doc string, edit func(*Sensor)) ([]check.Problem, Opener) {
	t.Helper()
	cfg := parseConfig(t, doc)
	sc := cfg.Sensors[0]
	if edit != nil {
		edit(&sc)
	}
	k := check.New(nil, false)
	_, _, open := parse(k, 0, sc)
	return k.Problems(), open
}

// wantProblem fails t unless ps is exactly one problem at path whose
// message contains msg.
func wantProblem(t *testing.T, ps []check.Problem, path, msg string) {
	t.Helper()
	if len(ps) != 1 || ps[0].Path != path || !strings.Contains(ps[0].Msg, msg) {
		t.Errorf("problems = %+v; want one at %s containing %q", ps, path, msg)
	}
}

func withOptions(opts map[string]string) func(*Sensor) {
	return func(sc *Sensor) { sc.Options = opts }
}

const (
	sht3xYAML = "sensors:\n  - {name: air, kind: sht3x, bus: \"1\", address: \"0x44\", interval: 10s}\n"
	sht4xYAML = "sensors:\n  - {name: air, kind: sht4x, bus: \"1\", address: \"0x44\", interval: 10s}\n"
)

// The traffic of opening each chip: soft reset, then the status register
// (0x0010, "reset detected") or the serial number (0x12345678).
var (
	sht3xOpenOps = []i2ctest.IO{
		{Addr: 0x44, W: []byte{0x30, 0xa2}},
		{Addr: 0x44, W: []byte{0xf3, 0x2d}},
		{Addr: 0x44, R: []byte{0x00, 0x10, 0xc2}},
	}
	sht4xOpenOps = []i2ctest.IO{
		{Addr: 0x44, W: []byte{0x94}},
		{Addr: 0x44, W: []byte{0x89}},
		{Addr: 0x44, R: []byte{0x12, 0x34, 0x37, 0x56, 0x78, 0x7d}},
	}
)

// openSHT parses doc with opts and opens the sensor on bus.
func openSHT(t *testing.T, doc string, opts map[string]string, bus Conn) (Device, error) {
	t.Helper()
	ps, open := parseSensorYAML(t, doc, withOptions(opts))
	if len(ps) > 0 {
		t.Fatalf("problems: %+v", ps)
	}
	return open(bus)
}

func ops(parts ...[]i2ctest.IO) []i2ctest.IO {
	var all []i2ctest.IO
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func TestSHTSensirionCRC(t *testing.T) {
	for _, tc := range []struct {
		data []byte
		want byte
	}{
		{[]byte{0xbe, 0xef}, 0x92}, // the datasheets' example
		{[]byte{0x00, 0x00}, 0x81},
		{[]byte{0xff, 0xff}, 0xac},
		{nil, 0xff}, // the initial value, untouched
	} {
		if got := sensirionCRC(tc.data); got != tc.want {
			t.Errorf("sensirionCRC(% x) = 0x%02x, want 0x%02x", tc.data, got, tc.want)
		}
	}
}

func TestSHTRead(t *testing.T) {
	for _, tc := range []struct {
		name, doc, precision string
		open                 []i2ctest.IO
		cmd                  []byte
		minWait              time.Duration
		answer               []byte
		temp, hum            float64
	}{
		{"sht3x high", sht3xYAML, "", sht3xOpenOps, []byte{0x24, 0x00}, 15500 * time.Microsecond,
			[]byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x88}, 25, 20},
		{"sht3x medium", sht3xYAML, "medium", sht3xOpenOps, []byte{0x24, 0x0b}, 6500 * time.Microsecond,
			[]byte{0x99, 0x99, 0xbe, 0x99, 0x99, 0xbe}, 60, 60},
		{"sht3x low", sht3xYAML, "low", sht3xOpenOps, []byte{0x24, 0x16}, 4500 * time.Microsecond,
			[]byte{0x66, 0x66, 0x93, 0xff, 0xff, 0xac}, 25, 100},
		{"sht4x high", sht4xYAML, "high", sht4xOpenOps, []byte{0xfd}, 8300 * time.Microsecond,
			[]byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x88}, 25, 19},
		{"sht4x medium clamps above 100 %", sht4xYAML, "medium", sht4xOpenOps, []byte{0xf6}, 4500 * time.Microsecond,
			[]byte{0x99, 0x99, 0xbe, 0xff, 0xff, 0xac}, 60, 100},
		{"sht4x low clamps below 0 %", sht4xYAML, "low", sht4xOpenOps, []byte{0xe0}, 1600 * time.Microsecond,
			[]byte{0x66, 0x66, 0x93, 0x00, 0x00, 0x81}, 25, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pb := &i2ctest.Playback{DontPanic: true, Ops: ops(tc.open, []i2ctest.IO{
				{Addr: 0x44, W: tc.cmd},
				{Addr: 0x44, R: tc.answer},
			})}
			var opts map[string]string
			if tc.precision != "" {
				opts = map[string]string{"precision": tc.precision}
			}
			dev, err := openSHT(t, tc.doc, opts, Conn{I2C: pb})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer dev.Close()
			vals := make([]float64, len(dev.Quantities()))
			start := time.Now()
			if err := dev.Read(context.Background(), vals); err != nil {
				t.Fatalf("Read: %v", err)
			}
			if took := time.Since(start); took < tc.minWait {
				t.Errorf("Read took %s; the conversion needs %s", took, tc.minWait)
			}
			if math.Abs(vals[0]-tc.temp) > 1e-9 || math.Abs(vals[1]-tc.hum) > 1e-9 {
				t.Errorf("vals = %v, want [%g %g]", vals, tc.temp, tc.hum)
			}
			if err := pb.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestSHTQuantities(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: sht4xOpenOps}
	dev, err := openSHT(t, sht4xYAML, nil, Conn{I2C: pb})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	qs := dev.Quantities()
	want := []Quantity{
		{Name: "temperature", Unit: "°C", Decimals: 2, Min: -40, Max: 125, Class: "temperature"},
		{Name: "humidity", Unit: "%", Decimals: 1, Min: 0, Max: 100, Class: "humidity"},
	}
	if len(qs) != 2 || qs[0] != want[0] || qs[1] != want[1] {
		t.Errorf("Quantities = %+v, want %+v", qs, want)
	}
	if got := dev.String(); got != "sht4x at 0x44 (serial 12345678)" {
		t.Errorf("String = %q", got)
	}
}

func TestSHTImplausibleTemperature(t *testing.T) {
	// 0xffff is 130 °C and 0x0000 is -45 °C, beyond the chip's range; the
	// humidity of the same reading is still good.
	for _, raw := range [][]byte{{0xff, 0xff, 0xac}, {0x00, 0x00, 0x81}} {
		pb := &i2ctest.Playback{DontPanic: true, Ops: ops(sht3xOpenOps, []i2ctest.IO{
			{Addr: 0x44, W: []byte{0x24, 0x00}},
			{Addr: 0x44, R: append(raw, 0x33, 0x33, 0x88)},
		})}
		dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: pb})
		if err != nil {
			t.Fatal(err)
		}
		vals := []float64{0, 0}
		if err := dev.Read(context.Background(), vals); err != nil {
			t.Errorf("raw % x: Read: %v; want no error while humidity is good", raw[:2], err)
		}
		if !math.IsNaN(vals[0]) || math.Abs(vals[1]-20) > 1e-9 {
			t.Errorf("raw % x: vals = %v, want [NaN 20]", raw[:2], vals)
		}
	}
}

// wantReadError reads dev and fails t unless the error wraps target and
// its message contains msg.
func wantReadError(t *testing.T, dev Device, target error, msg string) {
	t.Helper()
	err := dev.Read(context.Background(), make([]float64, len(dev.Quantities())))
	if !errors.Is(err, target) || Reason(err) != Reason(target) {
		t.Fatalf("Read = %v; want %v (reason %s)", err, target, Reason(target))
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("message %q lacks %q", err, msg)
	}
}

func TestSHTChecksumMismatch(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: ops(sht3xOpenOps, []i2ctest.IO{
		{Addr: 0x44, W: []byte{0x24, 0x00}},
		{Addr: 0x44, R: []byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x89}},
	})}
	dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: pb})
	if err != nil {
		t.Fatal(err)
	}
	wantReadError(t, dev, ErrCRC, "humidity word 33 33 has checksum 0x89 where 0x88 was due")
}

func TestSHTNackWhileMeasuring(t *testing.T) {
	reading := []i2ctest.IO{
		{Addr: 0x44, W: []byte{0x24, 0x00}},
		{Addr: 0x44, R: []byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x88}},
	}
	// Transactions 0-2 open the chip, 3 starts the measurement and 4 is
	// the first read-out.
	t.Run("busy once, then answers", func(t *testing.T) {
		pb := &i2ctest.Playback{DontPanic: true, Ops: ops(sht3xOpenOps, reading)}
		fb := &faultBus{Bus: pb, at: map[int]error{4: errLinuxNack}}
		dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: nackBus{fb}})
		if err != nil {
			t.Fatal(err)
		}
		vals := []float64{0, 0}
		if err := dev.Read(context.Background(), vals); err != nil {
			t.Fatalf("Read: %v (traffic %q)", err, fb.log)
		}
		if vals[0] != 25 || vals[1] != 20 {
			t.Errorf("vals = %v, want [25 20]", vals)
		}
		if fb.n != 6 {
			t.Errorf("%d transactions, want 6: %q", fb.n, fb.log)
		}
	})
	t.Run("never answers", func(t *testing.T) {
		pb := &i2ctest.Playback{DontPanic: true, Ops: ops(sht3xOpenOps, reading[:1])}
		at := map[int]error{}
		for i := 4; i < 4+1+shtBusyRetries; i++ {
			at[i] = errLinuxNack
		}
		fb := &faultBus{Bus: pb, at: at}
		dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: nackBus{fb}})
		if err != nil {
			t.Fatal(err)
		}
		wantReadError(t, dev, ErrNoAck, "sht3x at 0x44: read measurement: no answer on the bus")
		if fb.n != 4+1+shtBusyRetries {
			t.Errorf("%d transactions, want %d: %q", fb.n, 4+1+shtBusyRetries, fb.log)
		}
	})
}

func TestSHTOpenFailures(t *testing.T) {
	t.Run("nothing at the address", func(t *testing.T) {
		fb := &faultBus{Bus: &i2ctest.Playback{DontPanic: true}, at: map[int]error{0: errLinuxNack}}
		_, err := openSHT(t, sht3xYAML, nil, Conn{I2C: nackBus{fb}})
		if !errors.Is(err, ErrNoAck) || Reason(err) != ReasonNoAck {
			t.Fatalf("open = %v; want ErrNoAck", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "sht3x at 0x44: soft reset") || !strings.Contains(msg, "wired and powered") {
			t.Errorf("message %q names neither the step nor the remedy", msg)
		}
	})
	for _, tc := range []struct {
		name, doc string
		ops       []i2ctest.IO
		want      string
	}{
		{"sht3x status fails its checksum", sht3xYAML, []i2ctest.IO{
			sht3xOpenOps[0], sht3xOpenOps[1],
			{Addr: 0x44, R: []byte{0x00, 0x10, 0x00}},
		}, "status register answer 00 10 00 has checksum 0x00 where 0xc2 was due"},
		{"sht4x serial fails its second checksum", sht4xYAML, []i2ctest.IO{
			sht4xOpenOps[0], sht4xOpenOps[1],
			{Addr: 0x44, R: []byte{0x12, 0x34, 0x37, 0x56, 0x78, 0x7e}},
		}, "serial number answer 12 34 37 56 78 7e has checksum 0x7e where 0x7d was due"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pb := &i2ctest.Playback{DontPanic: true, Ops: tc.ops}
			_, err := openSHT(t, tc.doc, nil, Conn{I2C: pb})
			if !errors.Is(err, ErrWrongDevice) || Reason(err) != ReasonWrongDevice {
				t.Fatalf("open = %v; want ErrWrongDevice", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("message %q lacks %q", err, tc.want)
			}
			if err := pb.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestSHTContext(t *testing.T) {
	t.Run("done before the read", func(t *testing.T) {
		pb := &i2ctest.Playback{DontPanic: true, Ops: sht3xOpenOps}
		dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: pb})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := dev.Read(ctx, []float64{0, 0}); !errors.Is(err, context.Canceled) {
			t.Errorf("Read = %v; want context.Canceled", err)
		}
		if err := pb.Close(); err != nil {
			t.Errorf("a cancelled read touched the bus: %v", err)
		}
	})
	t.Run("deadline during the conversion", func(t *testing.T) {
		// The playback holds no read-out: reading one would fail the test.
		pb := &i2ctest.Playback{DontPanic: true, Ops: ops(sht3xOpenOps, []i2ctest.IO{{Addr: 0x44, W: []byte{0x24, 0x00}}})}
		dev, err := openSHT(t, sht3xYAML, nil, Conn{I2C: pb})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		err = dev.Read(ctx, []float64{0, 0})
		if !errors.Is(err, context.DeadlineExceeded) || Reason(err) != ReasonTimeout {
			t.Errorf("Read = %v; want a timeout", err)
		}
		if err := pb.Close(); err != nil {
			t.Error(err)
		}
	})
}

func TestSHTParse(t *testing.T) {
	ps, _ := parseSensorYAML(t, sht3xYAML, withOptions(map[string]string{"precision": "ultra"}))
	wantProblem(t, ps, "sensors[0].options.precision", `"ultra" is not allowed; use one of high, medium, low`)

	ps, _ = parseSensorYAML(t, sht3xYAML, withOptions(map[string]string{"repeatability": "high"}))
	wantProblem(t, ps, "sensors[0].options.repeatability", "unknown option for sht3x; known options: precision")

	ps, _ = parseSensorYAML(t, sht3xYAML, func(sc *Sensor) { sc.Address = "0x46" })
	wantProblem(t, ps, "sensors[0].address", "a sht3x answers only at 0x44 or 0x45, not 0x46")

	ps, _ = parseSensorYAML(t, sht4xYAML, func(sc *Sensor) { sc.Address = "0x46" })
	if len(ps) != 0 {
		t.Errorf("sht4x at 0x46: %+v", ps)
	}
}

func TestSHTOpensAtConfiguredAddress(t *testing.T) {
	doc := strings.Replace(sht4xYAML, "0x44", "0x45", 1)
	open := make([]i2ctest.IO, len(sht4xOpenOps))
	for i, io := range sht4xOpenOps {
		io.Addr = 0x45
		open[i] = io
	}
	pb := &i2ctest.Playback{DontPanic: true, Ops: open}
	dev, err := openSHT(t, doc, nil, Conn{I2C: pb})
	if err != nil {
		t.Fatal(err)
	}
	if got := dev.String(); !strings.HasPrefix(got, "sht4x at 0x45") {
		t.Errorf("String = %q", got)
	}
}

func TestSHTReadDoesNotAllocate(t *testing.T) {
	const runs = 50
	reading := []i2ctest.IO{
		{Addr: 0x44, W: []byte{0xe0}},
		{Addr: 0x44, R: []byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x88}},
	}
	all := sht4xOpenOps
	for range runs + 1 {
		all = ops(all, reading)
	}
	pb := &i2ctest.Playback{DontPanic: true, Ops: all}
	dev, err := openSHT(t, sht4xYAML, map[string]string{"precision": "low"}, Conn{I2C: pb})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vals := []float64{0, 0}
	var readErr error
	allocs := testing.AllocsPerRun(runs, func() {
		if err := dev.Read(ctx, vals); err != nil {
			readErr = err
		}
	})
	if readErr != nil {
		t.Fatal(readErr)
	}
	if allocs != 0 {
		t.Errorf("Read allocates %.1f times; want 0", allocs)
	}
}

func TestSHTDropImplausible(t *testing.T) {
	qs := []Quantity{{Name: "temperature", Unit: "°C", Min: -40, Max: 125}, {Name: "humidity", Unit: "%", Min: 0, Max: 100}}

	vals := []float64{130, 50}
	if err := dropImplausible(qs, vals); err != nil || !math.IsNaN(vals[0]) || vals[1] != 50 {
		t.Errorf("one bad: vals %v, err %v; want [NaN 50] and no error", vals, err)
	}

	vals = []float64{math.NaN(), -1}
	err := dropImplausible(qs, vals)
	if !errors.Is(err, ErrImplausible) || Reason(err) != ReasonImplausible {
		t.Fatalf("all bad: err %v; want ErrImplausible", err)
	}
	if !math.IsNaN(vals[0]) || !math.IsNaN(vals[1]) {
		t.Errorf("all bad: vals %v; want NaN", vals)
	}
	if msg := err.Error(); !strings.Contains(msg, "temperature NaN°C outside -40..125") || !strings.Contains(msg, "humidity -1% outside 0..100") {
		t.Errorf("message %q does not name both values", msg)
	}

	vals = []float64{-40, 100}
	if err := dropImplausible(qs, vals); err != nil || vals[0] != -40 || vals[1] != 100 {
		t.Errorf("at the limits: vals %v, err %v", vals, err)
	}
}

// TestSHT3xOnSimulatedBus runs the driver against the simulated SHT3x,
// which keeps real conversion times and refuses an early read-out.
func TestSHT3xOnSimulatedBus(t *testing.T) {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	w := sim.New(7, sim.WithClock(func() time.Time { return at }))
	buses := &Buses{Sim: w}
	bus, err := buses.I2C(SimBus)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(sht3xYAML, `bus: "1"`, "bus: sim", 1)
	dev, err := openSHT(t, doc, nil, Conn{I2C: bus})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer dev.Close()
	ctx := context.Background()
	vals := []float64{0, 0}
	if err := dev.Read(ctx, vals); err != nil {
		t.Fatalf("Read: %v", err)
	}
	want := w.Values()
	// One step of the 16-bit word is 175/65535 °C and 100/65535 %.
	if math.Abs(vals[0]-want.Temperature) > 0.01 || math.Abs(vals[1]-want.Humidity) > 0.01 {
		t.Errorf("vals = %v; the simulation has %.3f °C, %.3f %%", vals, want.Temperature, want.Humidity)
	}

	w.BadCRC(1)
	if err := dev.Read(ctx, vals); !errors.Is(err, ErrCRC) {
		t.Errorf("with a bad checksum Read = %v; want ErrCRC", err)
	}
	w.NACK(sim.AddrSHT3x, 1)
	if err := dev.Read(ctx, vals); !errors.Is(err, ErrNoAck) {
		t.Errorf("with a NACK Read = %v; want ErrNoAck", err)
	}
	if err := w.OutOfRange(sim.AddrSHT3x, true); err != nil {
		t.Fatal(err)
	}
	if err := dev.Read(ctx, vals); err != nil || !math.IsNaN(vals[0]) || vals[1] != 100 {
		t.Errorf("out of range: vals %v, err %v; want [NaN 100] and no error", vals, err)
	}
	if err := w.SetPresent(sim.AddrSHT3x, false); err != nil {
		t.Fatal(err)
	}
	if err := dev.Read(ctx, vals); Reason(err) != ReasonNoAck {
		t.Errorf("removed: Read = %v; want no_ack", err)
	}
}

// answerBus accepts every write and answers every read with answer, for
// benchmarks that read more often than a playback could be written out.
type answerBus struct{ answer []byte }

// Tx answers r with the canned answer.
func (a answerBus) Tx(_ uint16, _, r []byte) error { copy(r, a.answer); return nil }

// SetSpeed accepts any speed.
func (a answerBus) SetSpeed(physic.Frequency) error { return nil }

// String names the fake.
func (a answerBus) String() string { return "answer" }

// benchmarkRead reads d b.N times, reporting allocations.
func benchmarkRead(b *testing.B, d Device) {
	ctx := context.Background()
	vals := make([]float64, len(d.Quantities()))
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Read(ctx, vals); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSHT4xRead(b *testing.B) {
	d, err := sht4x.open(answerBus{[]byte{0x66, 0x66, 0x93, 0x33, 0x33, 0x88}}, 0x44, 2)
	if err != nil {
		b.Fatal(err)
	}
	benchmarkRead(b, d)
}
