package broker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker"
)

// A broker with no listeners and no state file serves in-process clients
// only: the sensors, the bridge and the actuators use it this way, on the
// same router as network clients. Add Listeners to serve the LAN, and a
// Store to keep persistent sessions and retained messages on disk.
func ExampleBroker() {
	b, err := broker.New(broker.Options{Config: broker.DefaultConfig()}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(); err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(context.Background())

	pump, err := b.Connect("pump-actuator")
	if err != nil {
		log.Fatal(err)
	}
	got := make(chan broker.Message, 1)
	if err := pump.Subscribe("site/pump/set", 1, func(m broker.Message) { got <- m }); err != nil {
		log.Fatal(err)
	}

	panel, err := b.Connect("control-panel")
	if err != nil {
		log.Fatal(err)
	}
	// A QoS 1 publish returns once it is routed (and, with a Store, stored).
	if err := panel.Publish(context.Background(), "site/pump/set", []byte("ON"), 1, false); err != nil {
		log.Fatal(err)
	}
	select {
	case m := <-got:
		fmt.Printf("%s: %s at QoS %d\n", m.Topic, m.Payload, m.QoS)
	case <-time.After(10 * time.Second):
		fmt.Println("no message")
	}
	// Output: site/pump/set: ON at QoS 1
}
