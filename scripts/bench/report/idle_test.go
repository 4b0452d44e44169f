package report

import (
	"strings"
	"testing"
)

// sampleIdle is the shape of bench-idle.sh's raw output.
const sampleIdle = `cpu: Test CPU
cores: 2
goos: linux
goarch: amd64
go: go1.26.8
fieldgate: fieldgate v1 (commit abc) go1.26.8 linux/amd64
mosquitto: 2.0.11
settings: DURATION=5m SETTLE=30s CONFIGS="default default-nobridge sensors50 sensors50-nobridge" SENSOR_INTERVAL=60s
date: 2026-12-02T00:00Z
loadavg-start: 1.00 1.00 1.00
config default sensors=6 route=bench/idle/#
config default-nobridge sensors=6 route=
config sensors50 sensors=50 route=bench/idle/#
idle default seconds=300.0 cpu_s=3.93 cpu_pct=1.3100 user_s=2.51 system_s=1.42 run_s=3.9000 wakeups_per_s=160.2 switches_per_s=170.4 threads=9 ready_s=2.1 sensors=6 sensor_reads=171 bridged=true bridge_up=1 bridge_sent=588 bridge_reconnects=0
idle default-nobridge seconds=300.0 cpu_s=0.27 cpu_pct=0.0900 user_s=0.15 system_s=0.12 run_s=0.2700 wakeups_per_s=28.3 switches_per_s=30.0 threads=8 ready_s=2.0 sensors=6 sensor_reads=171 bridged=false bridge_up=0 bridge_sent=0 bridge_reconnects=0
idle sensors50-nobridge seconds=300.0 cpu_s=0.36 cpu_pct=0.1200 user_s=0.20 system_s=0.16 run_s=0.3600 wakeups_per_s=33.0 switches_per_s=35.1 threads=8 ready_s=2.0 sensors=50 sensor_reads=250 bridged=false bridge_up=0 bridge_sent=0 bridge_reconnects=0
# warn sensors50: the bridge is not up for the whole measurement (sensors50): it reconnected or is down at the end
loadavg-end: 2.00 2.00 2.00
`

func TestIdleSummary(t *testing.T) {
	f, err := parseRaw("results/idle-amd64.txt", []byte(sampleIdle))
	if err != nil {
		t.Fatal(err)
	}
	s := newIdleSummary(f)
	vs := s.targets()
	if len(vs) != 2 || vs[0].outcome != missed || vs[1].outcome != unjudged {
		t.Fatalf("verdicts %v; want the default missed and sensors50 not judged (its run failed)", vs)
	}
	out := render(s)
	for _, want := range []string{
		"# Cost at rest\n",
		"| CPU at rest ≤ 0.2 % of one core, embedded default, bridge connected, no traffic | **✗ 1.310 % (3.93 CPU s in 300 s)** |",
		"| CPU at rest ≤ 0.2 % of one core, 50 simulated sensors, bridge connected, no traffic | not measured in this run |",
		"| `default` | embedded default, bridge connected, no traffic | 6 | 1.310 % | 3.93 (2.51 + 1.42) | 160.2 | 171 | 588 |",
		"| `default-nobridge` | embedded default, no bridge | 6 | 0.090 % | 0.27 (0.15 + 0.12) | 28.3 | 171 | no bridge |",
		"| `sensors50-nobridge` | 50 simulated sensors, no bridge | 50 | 0.120 % |",
		"- warn sensors50: the bridge is not up",
		"upstream: Mosquitto 2.0.11",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}

	// Under the target: met.
	under := strings.Replace(sampleIdle, "cpu_pct=1.3100", "cpu_pct=0.1500", 1)
	f, _ = parseRaw("results/idle-amd64.txt", []byte(under))
	if vs := newIdleSummary(f).targets(); vs[0].outcome != met {
		t.Errorf("0.15 %% judged %v; want met", vs[0])
	}
}
