package sensors_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/sensors"
)

// printer is a stand-in for the broker's in-process client: it keeps the
// first reading of each topic.
type printer struct {
	mu   sync.Mutex
	seen map[string][]byte
	got  chan struct{}
}

func (p *printer) Publish(_ context.Context, topic string, payload []byte, _ byte, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !strings.HasPrefix(topic, "fieldgate/greenhouse-1/climate/") || strings.HasSuffix(topic, "/status") {
		return nil // availability, health and discovery
	}
	if _, ok := p.seen[topic]; !ok {
		p.seen[topic] = payload
		if len(p.seen) == 3 {
			close(p.got)
		}
	}
	return nil
}

func (p *printer) Subscribe(string, byte, func(string, []byte, bool)) error { return nil }
func (p *printer) RetainedTopics(string) []string                           { return nil }

// A kind is named in the configuration; the poller opens each sensor on its
// bus (here the simulated one, so no hardware is needed) and publishes one
// JSON reading per quantity on its own schedule.
func ExamplePoller() {
	cfg := sensors.Config{
		Gateway: sensors.DefaultGateway(),
		Sensors: []sensors.Sensor{{Name: "climate", Kind: "bme280", Bus: "sim", Address: "0x76", Interval: 100 * time.Millisecond}},
	}
	cfg.Gateway.Name, cfg.Gateway.Discovery = "greenhouse-1", false
	cfg.Sensors[0].SetDefaults()
	cfg.Sensors[0].Jitter = 0

	out := &printer{seen: map[string][]byte{}, got: make(chan struct{})}
	p, err := sensors.New(cfg, sensors.Options{Client: out})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	<-out.got
	p.Stop(context.Background())

	for _, q := range []string{"temperature", "humidity", "pressure"} {
		var r struct{ Unit string }
		json.Unmarshal(out.seen["fieldgate/greenhouse-1/climate/"+q], &r)
		fmt.Println(q, "in", r.Unit)
	}
	// Output:
	// temperature in °C
	// humidity in %
	// pressure in hPa
}
