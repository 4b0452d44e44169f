package sensors

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker"
)

// brokerClient adapts the broker's in-process client for these benchmarks,
// so that the publish path measured is the real one.
type brokerClient struct{ *broker.Client }

func (c brokerClient) Subscribe(filter string, qos byte, h func(string, []byte, bool)) error {
	return c.Client.Subscribe(filter, qos, func(m broker.Message) { h(m.Topic, m.Payload, m.Retain) })
}

// benchBroker starts a broker without listeners or storage, with one
// in-process subscriber to every reading (standing in for the bridge).
func benchBroker(b *testing.B) (*broker.Broker, *broker.Client) {
	b.Helper()
	br, err := broker.New(broker.Options{Config: broker.DefaultConfig()}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := br.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Shutdown(context.Background()) })
	sub, err := br.Connect("bench-sub")
	if err != nil {
		b.Fatal(err)
	}
	if err := sub.Subscribe("fieldgate/#", 0, func(broker.Message) {}); err != nil {
		b.Fatal(err)
	}
	pub, err := br.Connect("bench-pub")
	if err != nil {
		b.Fatal(err)
	}
	return br, pub
}

// constant is a device that answers at once with fixed values, so that the
// benchmarks measure the poller and the publish path, not a driver.
type constant struct{ q []Quantity }

func (c *constant) Quantities() []Quantity { return c.q }
func (c *constant) Close() error           { return nil }
func (c *constant) String() string         { return "constant" }
func (c *constant) Read(_ context.Context, vals []float64) error {
	for i := range vals {
		vals[i] = 21.5 + float64(i)
	}
	return nil
}

func init() {
	Register(Kind{Name: "bench-constant", Bus: BusW1, Parse: func(s *Spec) Opener {
		s.Quantities = []Quantity{tempQuantity, {Name: "humidity", Unit: "%", Decimals: 1, Max: 100}, {Name: "pressure", Unit: "hPa", Decimals: 2, Min: 300, Max: 1100}}
		return func(Conn) (Device, error) { return &constant{q: s.Quantities}, nil }
	}})
}

func benchPoller(b *testing.B, n int, client Client, clock Clock) *Poller {
	b.Helper()
	var y strings.Builder
	y.WriteString("gateway: {name: bench, discovery: false}\nsensors:\n")
	for i := range n {
		fmt.Fprintf(&y, "  - {name: s%d, kind: bench-constant, bus: w1, address: x, interval: 1s, jitter: 500ms, qos: 0}\n", i)
	}
	p, err := New(parseConfig(b, y.String()), Options{Client: client, Clock: clock, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkPublishReading is the publish path of one reading of one
// quantity: payload encoding and the broker's in-process publish to one
// subscriber. Target: at most 2 allocations.
func BenchmarkPublishReading(b *testing.B) {
	_, pub := benchBroker(b)
	p := benchPoller(b, 1, brokerClient{pub}, SystemClock{})
	s := p.sensors[0]
	if err := s.openDevice(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer s.closeDevice()
	s.quants, s.topics, s.formats, s.vals = s.quants[:1], s.topics[:1], s.formats[:1], s.vals[:1]
	s.vals[0] = 21.5
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s.publish(ctx)
	}
}

// BenchmarkPoller200Sensors polls 200 three-quantity sensors every second
// on the real clock through a real broker with one subscriber: one op is
// one second of the schedule (200 readings, 600 published values). It
// reports the process CPU time, allocations and bytes per reading, and the
// heap each sensor keeps while polling. Run it with -benchtime=5x or more.
func BenchmarkPoller200Sensors(b *testing.B) {
	const n = 200
	_, pub := benchBroker(b)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := benchPoller(b, n, brokerClient{pub}, SystemClock{})
	if err := p.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer p.Stop(context.Background())
	reads := func() uint64 {
		var total uint64
		for _, st := range p.Stats() {
			total += st.Reads
		}
		return total
	}
	for reads() < n { // every sensor opened and read once
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perSensor := float64(after.HeapAlloc-before.HeapAlloc) / n

	start := reads()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		time.Sleep(time.Second)
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	runtime.ReadMemStats(&m1)
	got := reads() - start
	// Jitter moves readings across the window's edges: allow one second's.
	if got < uint64((b.N-1)*n) || got == 0 {
		b.Fatalf("%d readings in %d seconds of 200 sensors", got, b.N)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(got), "cpu-ns/reading")
	b.ReportMetric(100*cpu.Seconds()/b.Elapsed().Seconds(), "%cpu")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(got), "allocs/reading")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(got), "B/reading")
	b.ReportMetric(perSensor, "heapB/sensor")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
