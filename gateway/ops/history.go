package ops

import (
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The status page draws each quantity's last hour from a fixed ring of
// samples, so its memory does not grow with uptime.
const (
	// sampleEvery is the history's resolution: finer than any useful
	// sparkline of an hour, coarse enough to cost nothing.
	sampleEvery = 30 * time.Second
	// historySlots holds one hour at sampleEvery.
	historySlots = int(time.Hour / sampleEvery)
	// maxSeries bounds the quantities tracked: a gateway has a few dozen;
	// past this, new ones get no sparkline rather than more memory.
	maxSeries = 256
)

// seriesKey names one quantity of one sensor.
type seriesKey struct{ sensor, quantity string }

// series is one quantity's samples, aligned with history.times. float32
// halves the memory and is far finer than a sparkline's few pixels.
type series struct {
	vals [historySlots]float32 // NaN where there was no good reading
	seen uint64                // the tick that last carried a value
}

// history is the ring of samples behind the status page's sparklines. One
// ring of sample times is shared by all series; each series costs
// historySlots float32 values (480 bytes) plus its key and map entry.
type history struct {
	mu     sync.Mutex
	times  [historySlots]int64 // Unix seconds of each slot's sample; 0 if unused
	next   int                 // the slot the next sample goes in
	ticks  uint64              // samples taken
	series map[seriesKey]*series
}

func newHistory() *history {
	return &history{series: make(map[seriesKey]*series)}
}

// add records one sample of every sensor's values taken at now. A failing
// sensor's values are recorded as gaps: they are its last good ones, not
// readings at now. So are values a float32 cannot hold.
func (h *history) add(now time.Time, sensors []Sensor) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slot := h.next
	h.next = (h.next + 1) % historySlots
	h.ticks++
	h.times[slot] = now.Unix()
	nan := float32(math.NaN())
	for _, s := range h.series {
		s.vals[slot] = nan
	}
	for _, sn := range sensors {
		if !sn.OK {
			continue
		}
		for _, v := range sn.Values {
			k := seriesKey{sn.Name, v.Quantity}
			s := h.series[k]
			if s == nil {
				if len(h.series) >= maxSeries {
					continue
				}
				s = &series{}
				for i := range s.vals {
					s.vals[i] = nan
				}
				h.series[k] = s
			}
			f := float32(v.Value)
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				continue // beyond float32, or not a number: nothing to draw
			}
			s.vals[slot] = f
			s.seen = h.ticks
		}
	}
	// A quantity with no value for a whole ring has nothing left to draw:
	// its sensor was removed or has failed for an hour.
	for k, s := range h.series {
		if h.ticks-s.seen >= uint64(historySlots) {
			delete(h.series, k)
		}
	}
}

// Sparkline geometry, in the SVG's own units.
const (
	sparkWidth  = 120
	sparkHeight = 28
	sparkPad    = 2 // keeps the stroke inside the box at the extremes
)

// sparkline is one quantity's last hour, ready for an SVG.
type sparkline struct {
	Lines    []string // polyline point lists; a gap starts a new one
	Min, Max float64
	Samples  int
}

// sparkline returns the samples of one quantity taken in the hour before
// now, oldest on the left; ok is false when there are none.
func (h *history) sparkline(sensor, quantity string, now time.Time) (sparkline, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[seriesKey{sensor, quantity}]
	if s == nil {
		return sparkline{}, false
	}
	from := now.Add(-time.Hour).Unix()
	type point struct {
		t int64
		v float64
	}
	var pts []point
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range historySlots {
		slot := (h.next + i) % historySlots // oldest first
		t := h.times[slot]
		if t == 0 || t < from || t > now.Unix() {
			continue
		}
		v := float64(s.vals[slot])
		pts = append(pts, point{t, v})
		if !math.IsNaN(v) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return sparkline{}, false
	}
	sp := sparkline{Min: lo, Max: hi}
	var line strings.Builder
	flush := func() {
		if line.Len() > 0 {
			sp.Lines = append(sp.Lines, line.String())
			line.Reset()
		}
	}
	for _, p := range pts {
		if math.IsNaN(p.v) {
			flush()
			continue
		}
		sp.Samples++
		x := float64(p.t-from) / float64(time.Hour/time.Second) * sparkWidth
		y := float64(sparkHeight) / 2
		if hi > lo {
			y = sparkPad + (hi-p.v)/(hi-lo)*(sparkHeight-2*sparkPad)
		}
		if line.Len() > 0 {
			line.WriteByte(' ')
		}
		line.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
		line.WriteByte(',')
		line.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	flush()
	return sp, true
}

// sampleLoop samples the sensors now and every sampleEvery until stop closes.
func (s *Server) sampleLoop(stop <-chan struct{}) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		s.sample(s.now())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// sample records the sensors' values at now in the history.
func (s *Server) sample(now time.Time) {
	s.hist.add(now, call(s.src.Sensors))
}
