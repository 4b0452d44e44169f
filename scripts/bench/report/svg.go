package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Plot is a line chart with a logarithmic x axis (a count of subscriptions
// or connections, over decades) and a linear or logarithmic y axis: one
// polyline with round markers per series, a legend on the right. It is
// plain SVG 1.1 with a white background, so that it reads the same in
// GitHub's light and dark themes and in any browser.
type Plot struct {
	Title  string
	XLabel string
	YLabel string
	LogY   bool
	Series []Series
}

// Series is one line of a Plot. Points that cannot be drawn (NaN, or not
// positive on a logarithmic axis) are left out.
type Series struct {
	Name   string
	Points []Point
	Dashed bool // a variant of another series, e.g. the same code on 386
}

// Point is one measurement.
type Point struct{ X, Y float64 }

// Layout in SVG user units. The legend column is wide enough for
// "fieldgate (386)" and the like at the font size below.
const (
	svgWidth     = 760
	svgHeight    = 440
	plotLeft     = 84
	plotRight    = 580
	plotTop      = 48
	plotBottom   = 372
	legendLeft   = 600
	fontSize     = 13
	markerRadius = 3.5
)

// seriesColors gives every implementation the same colour in every plot;
// other names take the palette in order.
var seriesColors = map[string]string{
	"fieldgate": "#1f77b4",
	"mochi":     "#ff7f0e",
	"mosquitto": "#2ca02c",
	"nats":      "#9467bd",
}

var palette = []string{"#d62728", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// colorOf returns the colour of series name: that of its first word when
// it names a known implementation ("fieldgate (386)" is fieldgate's).
func colorOf(name string, other *int) string {
	first, _, _ := strings.Cut(name, " ")
	if c, ok := seriesColors[first]; ok {
		return c
	}
	c := palette[*other%len(palette)]
	*other++
	return c
}

// axis maps values to user units along one direction.
type axis struct {
	log    bool
	lo, hi float64 // value range; for a log axis, both positive
	from   float64 // user unit of lo
	to     float64 // user unit of hi
}

func (a axis) pos(v float64) float64 {
	f := (v - a.lo) / (a.hi - a.lo)
	if a.log {
		f = (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return a.from + f*(a.to-a.from)
}

// drawable reports whether v can be placed on the axis.
func drawable(v float64, log bool) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	return !log || v > 0
}

// logRange returns [lo, hi] widened by an eighth of a decade on each side,
// so that no marker sits on the frame, and to a whole decade at least.
func logRange(lo, hi float64) (float64, float64) {
	const pad = 0.12 // decades
	l, h := math.Log10(lo)-pad, math.Log10(hi)+pad
	if h-l < 1 {
		mid := (l + h) / 2
		l, h = mid-0.5, mid+0.5
	}
	return math.Pow(10, l), math.Pow(10, h)
}

// snap125 returns the nearest value of the 1, 2, 5, 10, 20, ... sequence
// at or below v, or at or above it when up is set; v must be positive.
func snap125(v float64, up bool) float64 {
	e := math.Pow(10, math.Floor(math.Log10(v)))
	steps := []float64{1, 2, 5, 10}
	if up {
		for _, s := range steps {
			if s*e >= v*(1-1e-9) {
				return s * e
			}
		}
	}
	for _, s := range slices.Backward(steps) {
		if s*e <= v*(1+1e-9) {
			return s * e
		}
	}
	return e
}

// logTicks returns the tick values within [lo, hi]: powers of ten, and
// their doubles and fives as well when the axis spans at most two and a
// half decades, so that a short axis still has a few labels.
func logTicks(lo, hi float64) []float64 {
	steps := []float64{1}
	if math.Log10(hi)-math.Log10(lo) <= 2.5 {
		steps = []float64{1, 2, 5}
	}
	var ticks []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, s := range steps {
			v := s * math.Pow(10, e)
			// Tolerate the rounding of Pow at the ends.
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ticks = append(ticks, v)
			}
		}
	}
	return ticks
}

// linearTicks returns 0 and multiples of a 1, 2 or 5 step up to the first
// multiple at or above hi, for about five intervals.
func linearTicks(hi float64) []float64 {
	if hi <= 0 {
		return []float64{0, 1}
	}
	raw := hi / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, s := range []float64{1, 2, 5, 10} {
		if s*mag >= raw {
			step = s * mag
			break
		}
	}
	ticks := []float64{0}
	for v := step; ; v += step {
		ticks = append(ticks, v)
		if v >= hi*(1-1e-9) {
			return ticks
		}
	}
}

// siLabel writes v with a k, M or G suffix and at most three significant
// digits: 2500 is "2.5k", 1e6 "1M".
func siLabel(v float64) string {
	a := math.Abs(v)
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if a >= u.div {
			return strconv.FormatFloat(roundSig(v/u.div, 3), 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(roundSig(v, 3), 'f', -1, 64)
}

func roundSig(v float64, digits int) float64 {
	if v == 0 {
		return 0
	}
	scale := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*scale) / scale
}

// WriteSVG draws p as a standalone SVG document. It fails when no series
// has a point it can draw.
func (p *Plot) WriteSVG(w io.Writer) error {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if drawable(pt.X, true) && drawable(pt.Y, p.LogY) {
				xlo, xhi = min(xlo, pt.X), max(xhi, pt.X)
				ylo, yhi = min(ylo, pt.Y), max(yhi, pt.Y)
			}
		}
	}
	if math.IsInf(xlo, 1) {
		return fmt.Errorf("plot %q: no point to draw", p.Title)
	}
	x := axis{log: true, from: plotLeft, to: plotRight}
	x.lo, x.hi = logRange(xlo, xhi)
	y := axis{log: p.LogY, from: plotBottom, to: plotTop}
	var yticks []float64
	if p.LogY {
		// Ends on a 1-2-5 value, so that both ends of the axis carry a label.
		y.lo, y.hi = logRange(ylo, yhi)
		y.lo, y.hi = snap125(y.lo, false), snap125(y.hi, true)
		yticks = logTicks(y.lo, y.hi)
	} else {
		yticks = linearTicks(yhi * 1.05)
		y.lo, y.hi = 0, yticks[len(yticks)-1]
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight, fontSize)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(p.Title))
	b.WriteString(`<rect x="0" y="0" width="100%" height="100%" fill="#ffffff"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="28" text-anchor="middle" font-size="16" font-weight="bold" fill="#222222">%s</text>`+"\n",
		(plotLeft+plotRight)/2, esc(p.Title))

	// Grid and tick labels.
	for _, v := range logTicks(x.lo, x.hi) {
		px := x.pos(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e5e5"/>`+"\n", px, plotTop, px, plotBottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#333333">%s</text>`+"\n", px, plotBottom+18, esc(siLabel(v)))
	}
	for _, v := range yticks {
		py := y.pos(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>`+"\n", plotLeft, py, plotRight, py)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="#333333">%s</text>`+"\n", plotLeft-6, py+4, esc(siLabel(v)))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#555555"/>`+"\n",
		plotLeft, plotTop, plotRight-plotLeft, plotBottom-plotTop)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" fill="#222222">%s</text>`+"\n",
		(plotLeft+plotRight)/2, plotBottom+44, esc(p.XLabel+" (log scale)"))
	ylabel := p.YLabel
	if p.LogY {
		ylabel += " (log scale)"
	}
	fmt.Fprintf(&b, `<text transform="translate(22 %d) rotate(-90)" text-anchor="middle" fill="#222222">%s</text>`+"\n",
		(plotTop+plotBottom)/2, esc(ylabel))

	// Series and legend.
	other := 0
	for i, s := range p.Series {
		color := colorOf(s.Name, &other)
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		var marks strings.Builder
		for _, pt := range s.Points {
			if !drawable(pt.X, true) || !drawable(pt.Y, p.LogY) {
				continue
			}
			px, py := x.pos(pt.X), y.pos(pt.Y)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
			fmt.Fprintf(&marks, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"><title>%s: %s at %s</title></circle>`+"\n",
				px, py, markerRadius, color, esc(s.Name), esc(siLabel(pt.Y)), esc(siLabel(pt.X)))
		}
		name := s.Name
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
			b.WriteString(marks.String())
		} else {
			name += " (no data)"
		}
		ly := plotTop + 10 + i*22
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n",
			legendLeft, ly, legendLeft+28, ly, color, dash)
		fmt.Fprintf(&b, `<circle cx="%d" cy="%d" r="%.1f" fill="%s"/>`+"\n", legendLeft+14, ly, markerRadius, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#222222">%s</text>`+"\n", legendLeft+36, ly+4, esc(name))
	}
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder cannot fail
	return b.String()
}
