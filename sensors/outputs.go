package sensors

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"periph.io/x/conn/v3/gpio"
)

// output is a GPIO output, such as a relay, that follows commands on
// {prefix}/{device}/{name}/set and reports its state, retained, on
// {prefix}/{device}/{name}/state.
type output struct {
	p   *Poller
	cfg Output
	log *slog.Logger

	mu  sync.Mutex
	pin gpio.PinIO
	on  bool
}

// parseCommand accepts ON, OFF, 1 and 0 (the words in any case, spaces
// around them ignored).
func parseCommand(payload []byte) (on bool, err error) {
	switch strings.ToUpper(strings.TrimSpace(string(payload))) {
	case "ON", "1":
		return true, nil
	case "OFF", "0":
		return false, nil
	}
	return false, fmt.Errorf("command %q not understood; send ON, OFF, 1 or 0", payload)
}

func (o *output) start(ctx context.Context) error {
	pin, err := o.p.opts.Buses.Pin(o.cfg.Bus, o.cfg.Pin)
	if err != nil {
		return fmt.Errorf("sensors: output %s: %w", o.cfg.Name, err)
	}
	o.mu.Lock()
	o.pin = pin
	o.mu.Unlock()
	// The safe state comes first: whatever the pin did before we started,
	// and before any command can arrive.
	if err := o.set(ctx, o.cfg.SafeState == "on", "safe state at start"); err != nil {
		return fmt.Errorf("sensors: output %s: %w", o.cfg.Name, err)
	}
	set := o.p.topics.of(o.cfg.Name, "set")
	err = o.p.opts.Client.Subscribe(set, byte(o.cfg.QoS), func(_ string, payload []byte, retained bool) {
		if retained {
			// A retained command is old news: acting on it at every start
			// would undo the safe state with a stale order.
			o.log.Warn("ignoring a retained command; commands should not be retained", "topic", set, "payload", string(payload))
			return
		}
		on, err := parseCommand(payload)
		if err != nil {
			o.log.Warn("command rejected", "topic", set, "err", err)
			return
		}
		if err := o.set(ctx, on, "command"); err != nil {
			o.log.Error("output command failed", "err", err)
		}
	})
	if err != nil {
		return fmt.Errorf("sensors: output %s: subscribe %s: %w", o.cfg.Name, set, err)
	}
	return nil
}

// set drives the pin and publishes the new state.
func (o *output) set(ctx context.Context, on bool, why string) error {
	o.mu.Lock()
	if o.pin == nil {
		o.mu.Unlock()
		return fmt.Errorf("output %s is not open", o.cfg.Name)
	}
	level := gpio.Level(on != o.cfg.ActiveLow)
	err := o.pin.Out(level)
	if err == nil {
		o.on = on
	}
	o.mu.Unlock()
	if err != nil {
		return fmt.Errorf("set %s %s: %w", o.cfg.Pin, onOff(on), err)
	}
	o.log.Info("output set", "state", onOff(on), "why", why)
	if err := o.p.opts.Client.Publish(ctx, o.p.topics.of(o.cfg.Name, "state"), []byte(onOff(on)), byte(o.cfg.QoS), true); err != nil {
		o.log.Warn("publishing output state failed", "err", err)
	}
	return nil
}

// stop returns the output to its safe state.
func (o *output) stop(ctx context.Context) {
	if err := o.set(ctx, o.cfg.SafeState == "on", "safe state at shutdown"); err != nil {
		o.log.Error("cannot return output to its safe state", "err", err)
	}
	o.mu.Lock()
	o.pin = nil
	o.mu.Unlock()
}

// State reports whether the output is on, for the status page.
func (o *output) state() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.on
}

func onOff(on bool) string {
	if on {
		return "ON"
	}
	return "OFF"
}

// OutputState is one output's name and whether it is on.
type OutputState struct {
	Name string
	On   bool
}

// Outputs returns every output's state, in configuration order.
func (p *Poller) Outputs() []OutputState {
	out := make([]OutputState, len(p.outputs))
	for i, o := range p.outputs {
		out[i] = OutputState{Name: o.cfg.Name, On: o.state()}
	}
	return out
}
