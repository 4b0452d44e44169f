package footprint

import (
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

func TestReadingCounter(t *testing.T) {
	var c readingCounter
	for _, m := range []struct {
		topic, payload string
		retain         bool
	}{
		{"fieldgate/gw/climate/temperature", `{"value":21.5,"unit":"°C","ts":"2026-11-30T00:00:00Z"}`, false},
		{"fieldgate/gw/climate/humidity", `{"value":60.8,"unit":"%"}`, false},
		{"fieldgate/gw/water/count", `{"value":0,"unit":""}`, false},
		{"fieldgate/gw/climate/status", `{"state":"ok"}`, true}, // retained status
		{"fieldgate/gw/availability", `online`, true},
		{"fieldgate/gw/door/status", `{"state":"failing"}`, false}, // a change of status
		{"fieldgate/gw/tank/pressure", `{"value":3.5}`, true},      // retained: it did not flow during the run
		{"fieldgate/gw/extra/a/b", `{"value":1}`, false},           // not SENSOR/QUANTITY
	} {
		c.add(&packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: m.retain},
			TopicName:   m.topic,
			Payload:     []byte(m.payload),
		})
	}
	got := c.snapshot()
	if got.readings != 3 || got.retained != 3 || got.other != 2 || len(got.sensors) != 2 || !got.sensors["climate"] || !got.sensors["water"] {
		t.Errorf("readings %d, retained %d, other %d, sensors %v; want 3, 3, 2 and climate and water",
			got.readings, got.retained, got.other, got.sensors)
	}
}

func TestParseExposition(t *testing.T) {
	page := `# HELP go_goroutines Goroutines.
# TYPE go_goroutines gauge
go_goroutines 33
fieldgate_sensor_up{sensor="climate",kind="bme280"} 1
fieldgate_sensor_up{sensor="door",kind="gpio_in"} 0
fieldgate_sensor_reads_total{sensor="climate"} 7
fieldgate_sensor_reads_total{sensor="door"} 2
go_gc_heap_goal_bytes 4.194304e+06
`
	e, err := parseExposition(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"go_goroutines": 33, "fieldgate_sensor_reads_total": 9, "go_gc_heap_goal_bytes": 4194304} {
		if got := e.sum[name]; got != want {
			t.Errorf("sum[%s] = %v, want %v", name, got, want)
		}
	}
	if got := e.series["fieldgate_sensor_up"]; got != 2 {
		t.Errorf("series[fieldgate_sensor_up] = %d, want 2", got)
	}
}
