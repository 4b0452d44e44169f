package ops

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// reading is a one-sensor, one-quantity snapshot for the history.
func reading(v float64, ok bool) []Sensor {
	return []Sensor{{Name: "bench", OK: ok, Values: []Value{{Quantity: "temperature", Unit: "°C", Value: v}}}}
}

// points parses a polyline's points.
func points(t *testing.T, line string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(line) {
		xs, ys, ok := strings.Cut(p, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad point %q in %q", p, line)
		}
		out = append(out, [2]float64{x, y})
	}
	return out
}

func TestHistoryRingKeepsTheLastHour(t *testing.T) {
	h := newHistory()
	// Two hours of samples: the ring must keep only the last hour's.
	start := epoch.Add(-2 * time.Hour)
	n := 2 * historySlots
	for i := range n {
		h.add(start.Add(time.Duration(i)*sampleEvery), reading(float64(i), true))
	}
	now := start.Add(time.Duration(n-1) * sampleEvery)
	sp, ok := h.sparkline("bench", "temperature", now)
	if !ok {
		t.Fatal("no sparkline after two hours of samples")
	}
	if sp.Samples != historySlots {
		t.Errorf("sparkline has %d samples, want %d (one hour)", sp.Samples, historySlots)
	}
	if sp.Min != float64(n-historySlots) || sp.Max != float64(n-1) {
		t.Errorf("sparkline spans %v..%v, want the last hour's %d..%d", sp.Min, sp.Max, n-historySlots, n-1)
	}
	if len(sp.Lines) != 1 {
		t.Fatalf("sparkline has %d lines, want 1 (no gaps)", len(sp.Lines))
	}
	pts := points(t, sp.Lines[0])
	for i := 1; i < len(pts); i++ {
		if pts[i][0] <= pts[i-1][0] {
			t.Fatalf("x does not grow at point %d: %v", i, pts)
		}
		// The values rise, so y (downwards in SVG) falls.
		if pts[i][1] >= pts[i-1][1] {
			t.Fatalf("y does not fall for a rising value at point %d: %v", i, pts)
		}
	}
	last := pts[len(pts)-1]
	if last[0] < sparkWidth-1 || last[0] > sparkWidth || last[1] != sparkPad {
		t.Errorf("the newest point is at %v, want the top right corner", last)
	}
	if first := pts[0]; first[1] != sparkHeight-sparkPad {
		t.Errorf("the oldest point is at %v, want the bottom", first)
	}
}

func TestHistoryMemoryIsFixed(t *testing.T) {
	h := newHistory()
	for i := range 10 * historySlots {
		h.add(epoch.Add(time.Duration(i)*sampleEvery), reading(1, true))
	}
	if len(h.series) != 1 || len(h.series[seriesKey{"bench", "temperature"}].vals) != historySlots {
		t.Errorf("history holds %d series, want 1 of %d slots", len(h.series), historySlots)
	}
	// Many quantities: capped at maxSeries.
	var many []Sensor
	for i := range maxSeries + 50 {
		many = append(many, Sensor{Name: "s" + strconv.Itoa(i), OK: true, Values: []Value{{Quantity: "q", Value: 1}}})
	}
	h.add(epoch.Add(time.Hour*100), many)
	if len(h.series) != maxSeries {
		t.Errorf("history holds %d series, want the cap of %d", len(h.series), maxSeries)
	}
}

func TestHistoryGapsAndPruning(t *testing.T) {
	h := newHistory()
	at := func(i int) time.Time { return epoch.Add(time.Duration(i) * sampleEvery) }
	// Good, failing, good: the failing samples are a gap, not the stale value.
	for i := range 30 {
		h.add(at(i), reading(float64(i%7), i < 10 || i >= 20))
	}
	sp, ok := h.sparkline("bench", "temperature", at(29))
	if !ok {
		t.Fatal("no sparkline")
	}
	if len(sp.Lines) != 2 || sp.Samples != 20 {
		t.Errorf("sparkline has %d lines and %d samples, want 2 around the failure and 20", len(sp.Lines), sp.Samples)
	}
	// A sensor that disappears keeps its line for an hour, then is dropped.
	for i := 30; i < 30+historySlots-1; i++ {
		h.add(at(i), nil)
	}
	if _, ok := h.series[seriesKey{"bench", "temperature"}]; !ok {
		t.Fatal("a series was dropped before an hour without values")
	}
	h.add(at(30+historySlots), nil)
	if len(h.series) != 0 {
		t.Errorf("a series without values for an hour is still held")
	}
	if _, ok := h.sparkline("bench", "temperature", at(30+historySlots)); ok {
		t.Error("a dropped series still draws")
	}
}

func TestHistoryFlatAndOld(t *testing.T) {
	h := newHistory()
	h.add(epoch, reading(5, true))
	h.add(epoch.Add(sampleEvery), reading(5, true))
	sp, ok := h.sparkline("bench", "temperature", epoch.Add(sampleEvery))
	if !ok {
		t.Fatal("no sparkline")
	}
	for _, p := range points(t, sp.Lines[0]) {
		if p[1] != sparkHeight/2 {
			t.Errorf("a flat series is drawn at y=%v, want the middle (%v)", p[1], sparkHeight/2)
		}
	}
	// Samples older than an hour are not drawn even if still in the ring
	// (the sampler stopped, say, and restarted).
	if _, ok := h.sparkline("bench", "temperature", epoch.Add(2*time.Hour)); ok {
		t.Error("samples two hours old are drawn")
	}
	// NaN and infinite values never reach the SVG as text.
	h.add(epoch.Add(2*sampleEvery), reading(math.Inf(1), true))
	h.add(epoch.Add(3*sampleEvery), reading(math.NaN(), true))
	sp, _ = h.sparkline("bench", "temperature", epoch.Add(3*sampleEvery))
	for _, l := range sp.Lines {
		if strings.Contains(l, "Inf") || strings.Contains(l, "NaN") {
			t.Errorf("polyline %q carries a non-number", l)
		}
	}
}

func TestSamplerRunsOnStart(t *testing.T) {
	f := newFakeGateway()
	s, _ := startServer(t, "", f.sources())
	// Start samples at once; later samples come from the ticker, which a
	// test does not wait for: it calls sample itself.
	deadline := time.Now().Add(testkit.Scale(5 * time.Second))
	for {
		s.hist.mu.Lock()
		n := s.hist.ticks
		s.hist.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Start took no history sample")
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.sample(epoch.Add(sampleEvery))
	if _, ok := s.hist.sparkline("bench", "pressure", epoch.Add(sampleEvery)); !ok {
		t.Error("no sparkline for bench pressure after sampling")
	}
	if _, ok := s.hist.sparkline("tank", "level", epoch.Add(sampleEvery)); ok {
		t.Error("a failing sensor's stale value was sampled")
	}
}
