package sim

import (
	"errors"
	"math"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testClock is a clock the test sets.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testStart is a summer morning, so that the daily cycle is neither at
// its top nor its bottom.
var testStart = time.Date(2025, 6, 1, 10, 30, 0, 0, time.UTC)

// newTestWorld returns a world on a clock stopped at testStart.
func newTestWorld(t *testing.T, seed int64, opts ...Option) (*World, *testClock) {
	t.Helper()
	clk := &testClock{t: testStart}
	return New(seed, append([]Option{WithClock(clk.Now)}, opts...)...), clk
}

// wantNACK checks that err is a refusal wrapping EREMOTEIO whose text
// holds why.
func wantNACK(t *testing.T, err error, why string) {
	t.Helper()
	if !errors.Is(err, syscall.EREMOTEIO) {
		t.Fatalf("got %v, want a NACK (EREMOTEIO) for %q", err, why)
	}
	if !strings.Contains(err.Error(), why) {
		t.Fatalf("NACK %q does not say %q", err, why)
	}
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func TestSimValuesStayPlausible(t *testing.T) {
	w, _ := newTestWorld(t, 7)
	var n, tSum, hSum, thSum, t2Sum, h2Sum float64
	var at15, at03 []float64
	lo := Values{Temperature: math.Inf(1), Tank: math.Inf(1), Pressure: math.Inf(1)}
	hi := Values{Temperature: math.Inf(-1), Tank: math.Inf(-1), Pressure: math.Inf(-1)}
	for at := testStart; at.Before(testStart.Add(30 * 24 * time.Hour)); at = at.Add(7 * time.Minute) {
		v := w.ValuesAt(at)
		for _, c := range []struct {
			name     string
			v        float64
			min, max float64
		}{
			{"temperature", v.Temperature, 13, 29},
			{"humidity", v.Humidity, 35, 70},
			{"pressure", v.Pressure, 1000, 1026},
			{"tank", v.Tank, 2, 6},
			{"battery", v.Battery, 12, 13.8},
			{"load", v.Load, 0.44, 0.56},
			{"A0", v.Inputs[0], 0.4, 2.0},
			{"A1", v.Inputs[1], 3.0, 3.45},
			{"A2", v.Inputs[2], -0.001, 0.001},
			{"A3", v.Inputs[3], -0.001, 0.001},
		} {
			if c.v < c.min || c.v > c.max || math.IsNaN(c.v) {
				t.Fatalf("%s: %s %g outside %g..%g", at, c.name, c.v, c.min, c.max)
			}
		}
		lo.Temperature, hi.Temperature = min(lo.Temperature, v.Temperature), max(hi.Temperature, v.Temperature)
		lo.Tank, hi.Tank = min(lo.Tank, v.Tank), max(hi.Tank, v.Tank)
		lo.Pressure, hi.Pressure = min(lo.Pressure, v.Pressure), max(hi.Pressure, v.Pressure)
		n++
		tSum += v.Temperature
		hSum += v.Humidity
		thSum += v.Temperature * v.Humidity
		t2Sum += v.Temperature * v.Temperature
		h2Sum += v.Humidity * v.Humidity
		switch at.Hour() {
		case 15:
			at15 = append(at15, v.Temperature)
		case 3:
			at03 = append(at03, v.Temperature)
		}
		// A0 is the 4–20 mA transmitter across 100 Ω.
		if want := (0.004 + 0.016*v.Tank/10) * 100; !near(v.Inputs[0], want, 1e-12) {
			t.Fatalf("A0 %g V for %g bar, want %g", v.Inputs[0], v.Tank, want)
		}
	}
	// Values move: over a month each spans a good part of its range.
	if hi.Temperature-lo.Temperature < 6 || hi.Tank-lo.Tank < 2 || hi.Pressure-lo.Pressure < 5 {
		t.Errorf("values barely move: temperature %g..%g, tank %g..%g, pressure %g..%g",
			lo.Temperature, hi.Temperature, lo.Tank, hi.Tank, lo.Pressure, hi.Pressure)
	}
	corr := (n*thSum - tSum*hSum) / math.Sqrt((n*t2Sum-tSum*tSum)*(n*h2Sum-hSum*hSum))
	if corr > -0.6 {
		t.Errorf("correlation of temperature and humidity %.2f, want strongly negative", corr)
	}
	if d := mean(at15) - mean(at03); d < 5 {
		t.Errorf("afternoon is only %.1f °C warmer than the night; want the daily cycle", d)
	}
}

func mean(vs []float64) float64 {
	var s float64
	for _, v := range vs {
		s += v
	}
	return s / float64(len(vs))
}

// TestSimDeterministic makes two worlds from one seed on one clock and
// expects the same readings through the bus and the same pin edges; a
// third world with another seed must differ.
func TestSimDeterministic(t *testing.T) {
	type trace struct {
		bytes []byte
		edges []time.Duration
	}
	run := func(seed int64) trace {
		w, clk := newTestWorld(t, seed, WithInstant())
		bus := w.I2C()
		var tr trace
		for range 20 {
			clk.Add(17 * time.Minute)
			r := make([]byte, 8)
			if err := bus.Tx(AddrBME280, []byte{0xF2, 1, 0xF4, 0x25}, nil); err != nil {
				t.Fatal(err)
			}
			if err := bus.Tx(AddrBME280, []byte{0xF7}, r); err != nil {
				t.Fatal(err)
			}
			tr.bytes = append(tr.bytes, r...)
			if err := bus.Tx(AddrADS1115, []byte{1, 0xC3, 0x83}, nil); err != nil { // A0, ±4.096 V, single shot
				t.Fatal(err)
			}
			if err := bus.Tx(AddrADS1115, []byte{0}, r[:2]); err != nil {
				t.Fatal(err)
			}
			tr.bytes = append(tr.bytes, r[:2]...)
		}
		p, err := w.Pin(PinDoor)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.In(0, 3); err != nil { // Float, BothEdges
			t.Fatal(err)
		}
		start := w.Now()
		for range 3600 {
			clk.Add(time.Second)
			if p.WaitForEdge(0) {
				tr.edges = append(tr.edges, w.Now().Sub(start))
			}
		}
		return tr
	}
	a, b, c := run(42), run(42), run(43)
	if string(a.bytes) != string(b.bytes) {
		t.Errorf("same seed, different readings:\n% x\n% x", a.bytes, b.bytes)
	}
	if len(a.edges) == 0 || len(a.edges) != len(b.edges) {
		t.Fatalf("same seed, door edges %v and %v", a.edges, b.edges)
	}
	for i := range a.edges {
		if a.edges[i] != b.edges[i] {
			t.Fatalf("same seed, door edges %v and %v", a.edges, b.edges)
		}
	}
	if string(a.bytes) == string(c.bytes) {
		t.Errorf("seeds 42 and 43 read the same")
	}
	if len(a.edges) == len(c.edges) && a.edges[0] == c.edges[0] {
		t.Errorf("seeds 42 and 43 move the door alike: %v", a.edges)
	}
}

func TestSimUnknownAddressAndBusBasics(t *testing.T) {
	w, _ := newTestWorld(t, 1)
	bus := w.I2C()
	for _, a := range []uint16{0x03, 0x41, 0x50, 0x77} {
		wantNACK(t, bus.Tx(a, nil, make([]byte, 1)), "no device at this address")
	}
	if err := bus.Tx(0x80, nil, make([]byte, 1)); err == nil || errors.Is(err, syscall.EREMOTEIO) {
		t.Errorf("a 10-bit address: %v, want an error that is not a NACK", err)
	}
	if err := bus.Tx(0x50, nil, nil); err != nil {
		t.Errorf("an empty transaction: %v, want nil as Linux's i2c-dev gives", err)
	}
	if err := bus.SetSpeed(0); err == nil {
		t.Error("SetSpeed(0) accepted")
	}
	if err := bus.SetSpeed(400_000_000_000); err != nil { // 400 kHz in physic's µHz
		t.Error(err)
	}
	if got := bus.String(); got != "sim-i2c" {
		t.Errorf("String() = %q", got)
	}
	want := []uint16{AddrINA219, AddrSHT3x, AddrADS1115, AddrBME280}
	if got := w.Addresses(); len(got) != len(want) || got[0] != want[0] || got[3] != want[3] {
		t.Errorf("Addresses() = %#x, want %#x", got, want)
	}
}

// TestSimConcurrentUse runs every chip's driver at once on one bus, for
// the race detector and for the serialisation of transactions.
func TestSimConcurrentUse(t *testing.T) {
	w, clk := newTestWorld(t, 3, WithInstant())
	bus := w.I2C()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, addr := range w.Addresses() {
		wg.Go(func() {
			for i := range 50 {
				var w []byte
				switch addr {
				case AddrSHT3x:
					w = []byte{0x24, 0x00}
				case AddrBME280:
					w = []byte{0xF4, 0x25}
				default:
					w = []byte{byte(i % 6)}
				}
				if err := bus.Tx(addr, w, nil); err != nil {
					errs <- err
					return
				}
				if err := bus.Tx(addr, nil, make([]byte, 6)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			clk.Add(time.Second)
			_ = w.Values()
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
