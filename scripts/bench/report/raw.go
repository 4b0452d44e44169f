package report

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// rawFile is one raw output file of a benchmark script. Its benchmark
// lines are read by benchfmt; the lines of our own around them are
// "key: value" lines (lib.sh's describe_machine, go test's header), "# skip
// NAME: why" and "# warn ..." comments, go test's FAIL lines, and the
// footprint's records ("size", "deb", "rss" and "runner" lines of
// key=value pairs).
type rawFile struct {
	name     string // as the Markdown names it: the path it was read from
	meta     meta
	results  []result
	skips    []skip
	warnings []string // the text of the "# warn" lines
	problems []string // the "# warn" and "# skip" lines without their "# "
	failures []string // go test's "--- FAIL", "FAIL" and "panic:" lines
	records  []record
}

// result is one benchmark line.
type result struct {
	name   string            // without "Benchmark" and the GOMAXPROCS suffix: "Broker/fieldgate/qos0-10x10"
	config map[string]string // the "key: value" lines in force at it, such as goarch
	values []value
}

// value is one figure of a result, in the unit the line gives it:
// benchfmt also tidies units (ns/op into sec/op), which the tables do not
// want.
type value struct {
	v    float64
	unit string
}

// skip is a "# skip NAME: why" line: a broker that could not run.
type skip struct{ who, why string }

// record is a footprint or idle line of the form KIND LABEL key=value...
type record struct {
	kind, label string
	kv          map[string]string
}

// meta holds the "key: value" lines of a file; a key may repeat.
type meta map[string][]string

// get returns the first value of key, or "".
func (m meta) get(key string) string {
	if v := m[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

var (
	metaRE = regexp.MustCompile(`^([a-z][a-z0-9-]*): (.*)$`)
	skipRE = regexp.MustCompile(`^# skip ([^:]+): (.*)$`)
	warnRE = regexp.MustCompile(`^# warn (.*)$`)
)

// recordKinds are the first words of the footprint's and the idle run's
// record lines.
var recordKinds = []string{"size", "deb", "rss", "runner", "config", "idle"}

// readRaw reads the raw file at path.
func readRaw(path string) (*rawFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseRaw(path, data)
}

// parseRaw reads data, the contents of the raw file name. A benchmark line
// that benchfmt cannot read is an error that names the file and line.
func parseRaw(name string, data []byte) (*rawFile, error) {
	f := &rawFile{name: name, meta: meta{}}
	br := benchfmt.NewReader(bytes.NewReader(data), name)
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			f.results = append(f.results, newResult(rec))
		}
	}
	if err := br.Err(); err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f.readLine(line)
	}
	return f, nil
}

func newResult(r *benchfmt.Result) result {
	base, parts := r.Name.Parts()
	name := string(base)
	for _, p := range parts {
		if p[0] == '/' {
			name += string(p)
		}
	}
	res := result{name: name, config: map[string]string{}}
	for _, c := range r.Config {
		res.config[c.Key] = string(c.Value)
	}
	for _, v := range r.Values {
		if v.OrigUnit != "" {
			res.values = append(res.values, value{v.OrigValue, v.OrigUnit})
		} else {
			res.values = append(res.values, value{v.Value, v.Unit})
		}
	}
	return res
}

// readLine takes in one line other than a benchmark line.
func (f *rawFile) readLine(line string) {
	if strings.HasPrefix(line, "--- FAIL") || strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "panic:") {
		f.failures = append(f.failures, strings.TrimSpace(line))
		return
	}
	text := strings.TrimSpace(line)
	if m := skipRE.FindStringSubmatch(text); m != nil {
		f.skips = append(f.skips, skip{m[1], m[2]})
		f.problems = append(f.problems, text[2:])
		return
	}
	if m := warnRE.FindStringSubmatch(text); m != nil {
		f.warnings = append(f.warnings, m[1])
		f.problems = append(f.problems, text[2:])
		return
	}
	if m := metaRE.FindStringSubmatch(text); m != nil {
		f.meta[m[1]] = append(f.meta[m[1]], m[2])
		return
	}
	kind, rest, _ := strings.Cut(text, " ")
	if !slices.Contains(recordKinds, kind) {
		return
	}
	fields := strings.Fields(rest)
	rec := record{kind: kind, kv: map[string]string{}}
	if len(fields) > 0 {
		rec.label = fields[0]
	}
	if kind == "runner" {
		// "runner LABEL how it runs": the rest is one value.
		_, how, _ := strings.Cut(rest, " ")
		rec.kv["how"] = how
	} else if len(fields) > 1 {
		for _, kv := range fields[1:] {
			if k, v, ok := strings.Cut(kv, "="); ok {
				rec.kv[k] = v
			}
		}
	}
	f.records = append(f.records, rec)
}

// samples holds every value of each benchmark and unit read, the
// benchmarks in the order they first appear.
type samples struct {
	names []string
	vals  map[string]map[string][]float64 // name -> unit -> values
}

func newSamples() *samples { return &samples{vals: map[string]map[string][]float64{}} }

// add records the values of r.
func (s *samples) add(r result) {
	units := s.vals[r.name]
	if units == nil {
		units = map[string][]float64{}
		s.vals[r.name] = units
		s.names = append(s.names, r.name)
	}
	for _, v := range r.values {
		units[v.unit] = append(units[v.unit], v.v)
	}
}

// median returns the median of the values of name in unit.
func (s *samples) median(name, unit string) (float64, bool) {
	return median(s.vals[name][unit])
}

// confidence is the level of the interval benchmath computes around a
// median, which the tables leave out.
const confidence = 0.95

// median of xs, benchmath's summary of a sample without assumptions about
// its distribution; ok is false when xs is empty.
func median(xs []float64) (float64, bool) {
	if len(xs) == 0 {
		return 0, false
	}
	// NewSample sorts what it is given.
	s := benchmath.NewSample(slices.Clone(xs), &benchmath.DefaultThresholds)
	return benchmath.AssumeNothing.Summary(s, confidence).Center, true
}

// readAll reads the raw files at paths, in order.
func readAll(paths []string) ([]*rawFile, error) {
	var out []*rawFile
	for _, p := range paths {
		f, err := readRaw(p)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		out = append(out, f)
	}
	return out, nil
}
