package report

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgElement is what the tests look at in a parsed SVG: every element's
// name, attributes and direct text.
type svgElement struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG decodes doc with encoding/xml, failing the test on any error,
// and returns its elements in document order.
func parseSVG(t *testing.T, doc []byte) []svgElement {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	d.Strict = true
	var out []svgElement
	var open []int // indexes into out of the elements not yet closed
	depth := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			if depth == 0 && (tok.Name.Local != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg") {
				t.Fatalf("root element is %v, want svg in the SVG namespace", tok.Name)
			}
			out = append(out, e)
			open = append(open, len(out)-1)
			depth++
		case xml.EndElement:
			open = open[:len(open)-1]
			depth--
		case xml.CharData:
			if len(open) > 0 {
				out[open[len(open)-1]].text += string(tok)
			}
		}
	}
	if depth != 0 {
		t.Fatalf("%d elements left open", depth)
	}
	return out
}

func elements(all []svgElement, name string) []svgElement {
	var out []svgElement
	for _, e := range all {
		if e.name == name {
			out = append(out, e)
		}
	}
	return out
}

// polylinePoints returns the coordinates of a polyline's points attribute.
func polylinePoints(t *testing.T, e svgElement) [][2]float64 {
	t.Helper()
	var pts [][2]float64
	for p := range strings.FieldsSeq(e.attrs["points"]) {
		xs, ys, ok := strings.Cut(p, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad point %q in %q", p, e.attrs["points"])
		}
		pts = append(pts, [2]float64{x, y})
	}
	return pts
}

func TestWriteSVG(t *testing.T) {
	p := Plot{
		Title:  "RSS <against> subscriptions & more",
		XLabel: "subscriptions",
		YLabel: "RSS, MiB",
		LogY:   true,
		Series: []Series{
			{Name: "fieldgate", Points: []Point{{1000, 9.5}, {10000, 12}, {100000, 32}}},
			// A zero cannot go on a log axis and NaN nowhere: two points remain.
			{Name: "mochi", Points: []Point{{1000, 0}, {10000, 40}, {100000, 241}, {1e6, math.NaN()}}},
			{Name: "mosquitto (386)", Points: []Point{{1000, 8}, {100000, 106}}, Dashed: true},
			{Name: "nats"}, // no points: in the legend only
		},
	}
	var b bytes.Buffer
	if err := p.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	all := parseSVG(t, b.Bytes())

	lines := elements(all, "polyline")
	wantPoints := []int{3, 2, 2}
	if len(lines) != len(wantPoints) {
		t.Fatalf("%d polylines, want one per series with points (%d)", len(lines), len(wantPoints))
	}
	colors := map[string]bool{}
	for i, l := range lines {
		pts := polylinePoints(t, l)
		if len(pts) != wantPoints[i] {
			t.Errorf("polyline %d (%s) has %d points, want %d", i, p.Series[i].Name, len(pts), wantPoints[i])
		}
		for j, pt := range pts {
			if pt[0] < plotLeft || pt[0] > plotRight || pt[1] < plotTop || pt[1] > plotBottom {
				t.Errorf("polyline %d point %d at %v is outside the plot area", i, j, pt)
			}
			// x grows with the count; y goes up (smaller) as the value grows.
			if j > 0 && pt[0] <= pts[j-1][0] {
				t.Errorf("polyline %d: x does not grow: %v", i, pts)
			}
			if j > 0 && pt[1] >= pts[j-1][1] {
				t.Errorf("polyline %d: larger value drawn lower: %v", i, pts)
			}
		}
		colors[l.attrs["stroke"]] = true
		if got := l.attrs["stroke-dasharray"] != ""; got != p.Series[i].Dashed {
			t.Errorf("polyline %d dashed = %v, want %v", i, got, p.Series[i].Dashed)
		}
	}
	if len(colors) != len(lines) {
		t.Errorf("series share colours: %v", colors)
	}
	if got := len(elements(all, "circle")); got != 3+2+2+4 {
		t.Errorf("%d circles, want a marker per point plus one per legend entry (11)", got)
	}

	var texts []string
	for _, e := range elements(all, "text") {
		texts = append(texts, e.text)
	}
	for _, want := range []string{p.Title, "subscriptions (log scale)", "RSS, MiB (log scale)",
		"fieldgate", "mochi", "mosquitto (386)", "nats (no data)", "1k", "10k", "100k"} {
		if !slices.Contains(texts, want) {
			t.Errorf("no text %q among %q", want, texts)
		}
	}
	if title := elements(all, "title")[0].text; title != p.Title {
		t.Errorf("title %q, want %q", title, p.Title)
	}
}

func TestWriteSVGLinear(t *testing.T) {
	p := Plot{Title: "t", XLabel: "x", YLabel: "y", Series: []Series{
		{Name: "fieldgate", Points: []Point{{1000, 0}, {2500, 120000}, {5000, 90000}}},
	}}
	var b bytes.Buffer
	if err := p.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	all := parseSVG(t, b.Bytes())
	lines := elements(all, "polyline")
	if len(lines) != 1 {
		t.Fatalf("%d polylines, want 1", len(lines))
	}
	pts := polylinePoints(t, lines[0])
	// A linear axis starts at 0, so the zero point sits on the bottom edge.
	if len(pts) != 3 || pts[0][1] != plotBottom {
		t.Errorf("points %v: want 3, the first at y=%d", pts, plotBottom)
	}
}

func TestWriteSVGNothingToDraw(t *testing.T) {
	p := Plot{Title: "empty", LogY: true, Series: []Series{{Name: "a", Points: []Point{{0, 1}, {10, -1}}}}}
	if err := p.WriteSVG(io.Discard); err == nil {
		t.Error("no error for a plot without a drawable point")
	}
}

func TestLogTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []float64
	}{
		{900, 11000, []float64{1000, 2000, 5000, 10000}},
		{700, 1.3e6, []float64{1000, 10000, 100000, 1e6}},
		{20, 500, []float64{20, 50, 100, 200, 500}},
	} {
		got := logTicks(c.lo, c.hi)
		if len(got) != len(c.want) {
			t.Errorf("logTicks(%g, %g) = %v, want %v", c.lo, c.hi, got, c.want)
			continue
		}
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-6*c.want[i] {
				t.Errorf("logTicks(%g, %g) = %v, want %v", c.lo, c.hi, got, c.want)
				break
			}
		}
	}
}

func TestLinearTicks(t *testing.T) {
	for _, c := range []struct {
		hi   float64
		want []float64
	}{
		{7, []float64{0, 2, 4, 6, 8}},
		{240, []float64{0, 50, 100, 150, 200, 250}},
		{1000, []float64{0, 200, 400, 600, 800, 1000}},
	} {
		if got := linearTicks(c.hi); !slices.Equal(got, c.want) {
			t.Errorf("linearTicks(%g) = %v, want %v", c.hi, got, c.want)
		}
	}
}

func TestSnap125(t *testing.T) {
	for _, c := range []struct{ v, up, down float64 }{
		{v: 24, up: 50, down: 20},
		{v: 300, up: 500, down: 200},
		{v: 1000, up: 1000, down: 1000},
		{v: 0.7, up: 1, down: 0.5},
	} {
		if got := snap125(c.v, true); math.Abs(got-c.up) > 1e-9 {
			t.Errorf("snap125(%g, up) = %g, want %g", c.v, got, c.up)
		}
		if got := snap125(c.v, false); math.Abs(got-c.down) > 1e-9 {
			t.Errorf("snap125(%g, down) = %g, want %g", c.v, got, c.down)
		}
	}
}

func TestSILabel(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 0.5: "0.5", 100: "100", 2500: "2.5k", 12345: "12.3k", 1e6: "1M", 2.5e9: "2.5G",
	} {
		if got := siLabel(v); got != want {
			t.Errorf("siLabel(%g) = %q, want %q", v, got, want)
		}
	}
}
