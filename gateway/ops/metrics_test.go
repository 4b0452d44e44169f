package ops

import (
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches /metrics, checks the page's shape and parses it with the
// Prometheus text parser.
func scrape(t *testing.T, base string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	resp, body := get(t, base+"/metrics")
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics = %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("/metrics Content-Type = %q, want the text format, version 0.0.4", ct)
	}
	checkLayout(t, body)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("the Prometheus parser rejects /metrics: %v\n%s", err, body)
	}
	return fams, body
}

// checkLayout checks what the parser lets pass: each family has one HELP
// and one TYPE line before its samples, its samples are together, and no
// series is written twice.
func checkLayout(t *testing.T, body string) {
	t.Helper()
	if !strings.HasSuffix(body, "\n") {
		t.Error("/metrics does not end with a newline")
	}
	var done []string // families already closed
	current, helped, typed := "", false, false
	series := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(rest, " ")
			if slices.Contains(done, name) || name == current {
				t.Errorf("line %d: second HELP for %s", i+1, name)
			}
			if current != "" {
				done = append(done, current)
			}
			current, helped, typed = name, help != "", false
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ := strings.Cut(rest, " ")
			if name != current || typed {
				t.Errorf("line %d: TYPE %s does not follow its HELP line", i+1, name)
			}
			typed = true
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		fam := strings.TrimSuffix(strings.TrimSuffix(name, "_sum"), "_count")
		if fam != current && name != current {
			t.Errorf("line %d: sample of %s outside its family (current %s)", i+1, name, current)
		}
		if !helped || !typed {
			t.Errorf("line %d: family %s lacks a HELP text or a TYPE line", i+1, current)
		}
		key := line[:strings.LastIndexByte(line, ' ')]
		if series[key] {
			t.Errorf("line %d: series %s written twice", i+1, key)
		}
		series[key] = true
	}
}

// sample returns the value of the series of family name with exactly the
// given labels (name, value pairs).
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Errorf("no family %s", name)
		return math.NaN()
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Untyped != nil:
			return m.GetUntyped().GetValue()
		}
		t.Errorf("%s%v is neither gauge nor counter", name, labels)
		return math.NaN()
	}
	t.Errorf("no series %s%v", name, labels)
	return math.NaN()
}

func TestMetricsValues(t *testing.T) {
	_, base := startServer(t, "", newFakeGateway().sources())
	fams, body := scrape(t, base)

	types := map[string]dto.MetricType{
		"fieldgate_broker_clients_connected":         dto.MetricType_GAUGE,
		"fieldgate_broker_messages_received_total":   dto.MetricType_COUNTER,
		"fieldgate_storage_commit_seconds":           dto.MetricType_SUMMARY,
		"fieldgate_sensor_value":                     dto.MetricType_GAUGE,
		"fieldgate_sensor_failures_total":            dto.MetricType_COUNTER,
		"fieldgate_bridge_outbox_oldest_age_seconds": dto.MetricType_GAUGE,
		"fieldgate_bridge_reconnects_total":          dto.MetricType_COUNTER,
		"fieldgate_bridge_dead_letters":              dto.MetricType_GAUGE,
		"fieldgate_bridge_dead_lettered_total":       dto.MetricType_COUNTER,
		"go_goroutines":                              dto.MetricType_GAUGE,
		"go_gc_cycles_total":                         dto.MetricType_COUNTER,
	}
	for name, typ := range types {
		f := fams[name]
		if f == nil {
			t.Errorf("no family %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s has TYPE %v, want %v", name, f.GetType(), typ)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s has no HELP text", name)
		}
	}

	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fieldgate_build_info", []string{"device", "greenhouse-1", "version", "1.2.3"}, 1},
		{"fieldgate_ready", nil, 1},
		{"fieldgate_start_time_seconds", nil, float64(epoch.Unix() - 3*3600 - 25*60)},
		{"fieldgate_broker_clients_connected", nil, 3},
		{"fieldgate_broker_sessions", nil, 5},
		{"fieldgate_broker_connections_total", nil, 42},
		{"fieldgate_broker_subscriptions", nil, 11},
		{"fieldgate_broker_retained_messages", nil, 4},
		{"fieldgate_broker_messages_received_total", nil, 1000},
		{"fieldgate_broker_messages_sent_total", nil, 2000},
		{"fieldgate_broker_received_bytes_total", nil, 123456},
		{"fieldgate_broker_sent_bytes_total", nil, 654321},
		{"fieldgate_broker_messages_dropped_total", []string{"reason", "queue"}, 7},
		{"fieldgate_broker_messages_dropped_total", []string{"reason", "refused"}, 2},
		{"fieldgate_storage_file_bytes", nil, 1<<20 + 12345},
		{"fieldgate_storage_commit_failures_total", nil, 1},
		{"fieldgate_storage_lazy_commits_lost_total", nil, 3},
		{"fieldgate_sensor_up", []string{"sensor", "bench", "kind", "bme280"}, 1},
		{"fieldgate_sensor_up", []string{"sensor", "tank", "kind", "ads1115"}, 0},
		{"fieldgate_sensor_reads_total", []string{"sensor", "bench"}, 360},
		{"fieldgate_sensor_failures_total", []string{"sensor", "bench", "reason", "timeout"}, 2},
		{"fieldgate_sensor_failures_total", []string{"sensor", "bench", "reason", "crc"}, 1},
		{"fieldgate_sensor_failures_total", []string{"sensor", "tank", "reason", "no_device"}, 12},
		{"fieldgate_sensor_value", []string{"sensor", "bench", "quantity", "temperature", "unit", "°C"}, 21.5},
		{"fieldgate_sensor_value", []string{"sensor", "bench", "quantity", "humidity", "unit", "%"}, 48.25},
		{"fieldgate_sensor_value", []string{"sensor", "tank", "quantity", "level", "unit", "bar"}, 1.75},
		{"fieldgate_sensor_last_read_timestamp_seconds", []string{"sensor", "bench"}, float64(epoch.Unix() - 5)},
		{"fieldgate_output_on", []string{"output", "pump"}, 0},
		{"fieldgate_output_on", []string{"output", "fan"}, 1},
		{"fieldgate_bridge_up", []string{"bridge", "cloud"}, 1},
		{"fieldgate_bridge_up", []string{"bridge", "backup"}, 0},
		{"fieldgate_bridge_state", []string{"bridge", "backup", "state", "down"}, 1},
		{"fieldgate_bridge_state", []string{"bridge", "backup", "state", "connected"}, 0},
		{"fieldgate_bridge_outbox_messages", []string{"bridge", "cloud"}, 12},
		{"fieldgate_bridge_outbox_bytes", []string{"bridge", "cloud"}, 3456},
		{"fieldgate_bridge_outbox_oldest_age_seconds", []string{"bridge", "cloud"}, 90},
		{"fieldgate_bridge_messages_sent_total", []string{"bridge", "cloud"}, 100},
		{"fieldgate_bridge_messages_acked_total", []string{"bridge", "cloud"}, 95},
		{"fieldgate_bridge_messages_inbound_total", []string{"bridge", "cloud"}, 3},
		{"fieldgate_bridge_reconnects_total", []string{"bridge", "cloud"}, 2},
		{"fieldgate_bridge_messages_dropped_total", []string{"bridge", "cloud", "reason", "full"}, 4},
		{"fieldgate_bridge_messages_dropped_total", []string{"bridge", "cloud", "reason", "expired"}, 1},
		{"fieldgate_bridge_inflight_window", []string{"bridge", "cloud"}, 32},
		{"fieldgate_bridge_dead_letters", []string{"bridge", "cloud"}, 4},
		{"fieldgate_bridge_dead_letters", []string{"bridge", "backup"}, 0},
		{"fieldgate_bridge_dead_letter_bytes", []string{"bridge", "cloud"}, 900},
		{"fieldgate_bridge_dead_lettered_total", []string{"bridge", "cloud"}, 5},
		{"fieldgate_bridge_failing_attempts", []string{"bridge", "cloud"}, 0},
		{"fieldgate_bridge_failing_attempts", []string{"bridge", "backup"}, 6},
		{"fieldgate_bridge_qos_limit", []string{"bridge", "cloud"}, 2},
		{"fieldgate_bridge_qos_limit", []string{"bridge", "backup"}, 1},
		{"fieldgate_bridge_protocol_version", []string{"bridge", "cloud"}, 5},
		{"fieldgate_bridge_protocol_version", []string{"bridge", "backup"}, 4},
		{"fieldgate_bridge_messages_dropped_total", []string{"bridge", "cloud", "reason", "dead_letter_full"}, 1},
		{"go_info", []string{"version", runtime.Version()}, 1},
	}
	for _, tt := range tests {
		if got := sample(t, fams, tt.name, tt.labels...); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}

	sum := fams["fieldgate_storage_commit_seconds"].GetMetric()[0].GetSummary()
	if sum.GetSampleCount() != 500 || sum.GetSampleSum() != 2.5 {
		t.Errorf("commit latency summary = count %d sum %v, want 500 and 2.5", sum.GetSampleCount(), sum.GetSampleSum())
	}
	// Each state of a bridge is a series, exactly one of them 1.
	var states, on int
	for _, m := range fams["fieldgate_bridge_state"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "bridge" && l.GetValue() == "cloud" {
				states++
				if m.GetGauge().GetValue() == 1 {
					on++
				}
			}
		}
	}
	if states != len(bridgeStates) || on != 1 {
		t.Errorf("bridge cloud has %d state series with %d set, want %d with 1", states, on, len(bridgeStates))
	}
	if g := sample(t, fams, "go_goroutines"); g < 2 {
		t.Errorf("go_goroutines = %v, want the server's own at least", g)
	}
	if h := sample(t, fams, "go_heap_objects_bytes"); h <= 0 {
		t.Errorf("go_heap_objects_bytes = %v, want > 0", h)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// TestMetricsEscaping feeds label values and help-breaking text through
// the writer and reads them back with the Prometheus parser.
func TestMetricsEscaping(t *testing.T) {
	nasty := []string{
		`back\slash`,
		`"quoted"`,
		"new\nline",
		`trailing\`,
		"µS/cm °C",
		`\n literally`,
		"",
	}
	var sensors []Sensor
	for i, s := range nasty {
		sensors = append(sensors, Sensor{
			Name:     "s" + string(rune('a'+i)),
			OK:       true,
			Failures: map[string]uint64{s: uint64(i + 1)},
			Values:   []Value{{Quantity: "q", Unit: s, Value: float64(i)}},
		})
	}
	sensors = append(sensors, Sensor{Name: "extremes", OK: true, Values: []Value{
		{Quantity: "nan", Value: math.NaN()},
		{Quantity: "inf", Value: math.Inf(1)},
		{Quantity: "neginf", Value: math.Inf(-1)},
		{Quantity: "tiny", Value: 1e-300},
		{Quantity: "huge", Value: -1.5e300},
	}})
	_, base := startServer(t, "", Sources{
		Sensors:  func() []Sensor { return sensors },
		Identity: func() Identity { return Identity{Name: "a \"gate\"\\way\n2", Version: "v1"} },
	})
	fams, _ := scrape(t, base)
	for i, s := range nasty {
		name := "s" + string(rune('a'+i))
		if got := sample(t, fams, "fieldgate_sensor_value", "sensor", name, "quantity", "q", "unit", s); got != float64(i) {
			t.Errorf("value with unit %q = %v, want %d", s, got, i)
		}
		if got := sample(t, fams, "fieldgate_sensor_failures_total", "sensor", name, "reason", s); got != float64(i+1) {
			t.Errorf("failures with reason %q = %v, want %d", s, got, i+1)
		}
	}
	if got := sample(t, fams, "fieldgate_build_info", "device", "a \"gate\"\\way\n2", "version", "v1"); got != 1 {
		t.Errorf("build info with an escaped device name = %v", got)
	}
	for q, want := range map[string]float64{"inf": math.Inf(1), "neginf": math.Inf(-1), "tiny": 1e-300, "huge": -1.5e300} {
		if got := sample(t, fams, "fieldgate_sensor_value", "sensor", "extremes", "quantity", q, "unit", ""); got != want {
			t.Errorf("%s = %v, want %v", q, got, want)
		}
	}
	if got := sample(t, fams, "fieldgate_sensor_value", "sensor", "extremes", "quantity", "nan", "unit", ""); !math.IsNaN(got) {
		t.Errorf("nan = %v, want NaN", got)
	}
}

func TestAppendEscaped(t *testing.T) {
	tests := []struct {
		in          string
		label, help string
	}{
		{`plain`, `plain`, `plain`},
		{`a"b`, `a\"b`, `a"b`},
		{`a\b`, `a\\b`, `a\\b`},
		{"a\nb", `a\nb`, `a\nb`},
		{"°C", "°C", "°C"},
	}
	for _, tt := range tests {
		if got := string(appendEscaped(nil, tt.in, true)); got != tt.label {
			t.Errorf("label value %q escaped to %q, want %q", tt.in, got, tt.label)
		}
		if got := string(appendEscaped(nil, tt.in, false)); got != tt.help {
			t.Errorf("help text %q escaped to %q, want %q", tt.in, got, tt.help)
		}
	}
}

func BenchmarkMetrics(b *testing.B) {
	s := New("127.0.0.1:0", newFakeGateway().sources(), nil)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		var e exposition
		s.writeMetrics(&e)
		size = len(e.b)
	}
	b.ReportMetric(float64(size), "bytes/page")
}
