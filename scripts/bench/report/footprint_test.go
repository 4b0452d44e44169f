package report

import (
	"strings"
	"testing"
)

// sampleFootprint is the shape of bench-footprint.sh's raw output, cut short.
const sampleFootprint = `cpu: Test CPU
cores: 2
goos: linux
goarch: amd64
go: go1.26.8
fieldgate: fieldgate v1 (commit abc) go1.26.8 linux/amd64
settings: COUNT=3
date: 2026-11-30T00:00Z
loadavg-start: 1.00 1.00 1.00
release: GOOS=linux GOARCH=arm GOARM=6 CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/fieldgate-linux-armv6 ./cmd/fieldgate
size armv6 bytes=11075746 file=fieldgate-linux-armv6 goos=linux goarch=arm goarm=6
size arm64 bytes=10813602 file=fieldgate-linux-arm64 goos=linux goarch=arm64
deb fieldgate_1_arm64.deb bytes=4194304
runner 386 native
runner armv6 qemu-arm-static -cpu arm1176
heap-binary: 386
goos: linux
goarch: 386
pkg: github.com/fieldgate/fieldgate/gateway/broker
cpu: AMD EPYC
BenchmarkFootprint/conns=10000-2   	       1	         1.000 goroutines/conn	      1103 heap-B/conn	      4109 stack-B/conn
BenchmarkFootprint/subs=100000/conns=100-2   	       1	        95.69 heap-B/sub
PASS
heap-binary: 386
BenchmarkFootprint/conns=10000-2   	       1	         1.000 goroutines/conn	      1200 heap-B/conn	      4099 stack-B/conn
BenchmarkFootprint/subs=100000/conns=100-2   	       1	        95.69 heap-B/sub
heap-binary: 386
BenchmarkFootprint/conns=10000-2   	       1	         1.000 goroutines/conn	      1000 heap-B/conn	      4099 stack-B/conn
BenchmarkFootprint/subs=100000/conns=100-2   	       1	        95.69 heap-B/sub
heap-binary: armv6
goarch: arm
BenchmarkFootprint/conns=10000-2   	       1	         1.000 goroutines/conn	      1102 heap-B/conn	      4099 stack-B/conn
sample armv6 t=0 vmrss=45232128
rss armv6 ready_s=2.26 seconds=60 samples=61 vmrss_start=45232128 vmrss_max=48328704 vmrss_end=48328704 vmhwm=48328704 guest_rss_end=48336896 heap_start=415672 heap_max=740200 heap_end=740200 heap_goal_end=4194304 go_mapped_end=5979260 goroutines_end=33 gc_cycles=1 sensor_reads=9 readings=16 retained=2 other=6 sensors_seen=6 sensors=6
# warn rss arm64: the gateway ended with status 1
loadavg-end: 2.00 2.00 2.00
`

func TestFootprintSummary(t *testing.T) {
	f, err := parseRaw("results/footprint-amd64.txt", []byte(sampleFootprint))
	if err != nil {
		t.Fatal(err)
	}
	raw := newFootprintSummary(f)
	if got := raw.meta.get("goarch"); got != "amd64" {
		t.Errorf("header goarch = %q, want the host's, amd64", got)
	}
	if got := raw.bench["386"].vals["conns=10000"]["heap-B/conn"]; len(got) != 3 {
		t.Errorf("386 heap-B/conn = %v, want three runs", got)
	}
	if got := raw.bench["armv6"].vals["conns=10000"]["heap-B/conn"]; len(got) != 1 || got[0] != 1102 {
		t.Errorf("armv6 heap-B/conn = %v, want [1102] (heap-binary, not goarch, names it)", got)
	}
	out := render(raw)
	for _, want := range []string{
		"# ARM footprint\n",
		"| `fieldgate-linux-armv6` | linux/arm, GOARM=6 | 11,075,746 | 10.56 |",
		"| `fieldgate_1_arm64.deb` | 4,194,304 | 4.00 |",
		"| figure | 386, native, 3 runs | armv6, QEMU, 1 run |",
		"| heap per idle connection | 1,103 B (1,000–1,200) | 1,102 B |",
		"| goroutine stacks per idle connection | 4,099 B (4,099–4,109) | 4,099 B |",
		"| heap per subscription | 96 B | n/a |",
		"| 100,000 subscriptions: heap | 9.1 MiB | n/a |",
		"| armv6 | `qemu-arm-static -cpu arm1176` | 2.3 s | 43.1 MiB | 46.1 MiB | 46.1 MiB | 46.1 MiB | 16 from 6 of 6 sensors |",
		"- warn rss arm64: the gateway ended with status 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
