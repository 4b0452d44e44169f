package sensors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/fieldgate/fieldgate/sensors/sim"
	"periph.io/x/conn/v3/driver/driverreg"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpioreg"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/host/v3/gpioioctl"
	"periph.io/x/host/v3/sysfs"
)

// SimBus is the bus name of the simulated hardware.
const SimBus = "sim"

// DefaultW1Dir is where the kernel's w1 driver lists 1-Wire devices.
const DefaultW1Dir = "/sys/bus/w1/devices"

// Buses opens the buses sensors are wired to, once each, and shares them:
// I²C buses through /dev/i2c-N, GPIO lines through the GPIO character
// device (/dev/gpiochipN), 1-Wire devices through the kernel's w1 sysfs
// directory, and the simulated hardware for bus sim.
type Buses struct {
	W1Dir string     // the w1 devices directory; DefaultW1Dir when empty
	Sim   *sim.World // the simulated hardware; created on first use when nil

	mu      sync.Mutex
	i2c     map[int]i2c.BusCloser
	gpioErr error
	gpioOK  bool
}

// Conn connects one sensor's spec to its bus.
func (b *Buses) conn(k Kind, s *Spec) (Conn, error) {
	switch k.Bus {
	case BusI2C:
		bus, err := b.I2C(s.Bus)
		if err != nil {
			return Conn{}, err
		}
		return Conn{I2C: bus}, nil
	case BusGPIO:
		p, err := b.Pin(s.Bus, s.Address)
		if err != nil {
			return Conn{}, err
		}
		return Conn{Pin: p}, nil
	case BusW1:
		dir := b.W1Dir
		if dir == "" {
			dir = DefaultW1Dir
		}
		return Conn{W1Dir: filepath.Join(dir, s.Address)}, nil
	}
	return Conn{}, fmt.Errorf("sensors: kind %s has no bus type", k.Name)
}

func (b *Buses) sim() *sim.World {
	if b.Sim == nil {
		b.Sim = sim.New(1)
	}
	return b.Sim
}

// simWorld returns the simulated hardware, creating it on first use.
func (b *Buses) simWorld() *sim.World {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sim()
}

// I2C returns the I²C bus name: a bus number such as 1 (also i2c-1,
// i2c1 or /dev/i2c-1), or sim. Errors from the bus that mean "no
// device answered" wrap ErrNoAck.
func (b *Buses) I2C(name string) (i2c.Bus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if name == SimBus {
		return nackBus{b.sim().I2C()}, nil
	}
	n, err := i2cBusNumber(name)
	if err != nil {
		return nil, err
	}
	if bus := b.i2c[n]; bus != nil {
		return nackBus{bus}, nil
	}
	bus, err := sysfs.NewI2C(n)
	if err != nil {
		return nil, fmt.Errorf("sensors: open /dev/i2c-%d: %w (is I²C enabled, e.g. dtparam=i2c_arm=on, and is the user in the i2c group?)", n, err)
	}
	if b.i2c == nil {
		b.i2c = map[int]i2c.BusCloser{}
	}
	b.i2c[n] = bus
	return nackBus{bus}, nil
}

// Pin returns the GPIO pin name on bus gpio (the board's GPIO character
// devices) or sim.
func (b *Buses) Pin(bus, name string) (gpio.PinIO, error) {
	if bus == SimBus {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.sim().Pin(name)
	}
	b.mu.Lock()
	if !b.gpioOK && b.gpioErr == nil {
		// Only the character-device driver is linked in; sysfs GPIO is
		// deprecated and gone from current kernels.
		if _, err := driverreg.Init(); err != nil {
			b.gpioErr = err
		}
		if len(gpioioctl.Chips) == 0 && b.gpioErr == nil {
			b.gpioErr = errors.New("no /dev/gpiochip* found")
		}
		b.gpioOK = b.gpioErr == nil
	}
	err := b.gpioErr
	b.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("sensors: GPIO: %w (is the user in the gpio group?)", err)
	}
	p := gpioreg.ByName(name)
	if p == nil {
		return nil, fmt.Errorf("sensors: GPIO pin %q not found; use a name such as GPIO17", name)
	}
	return p, nil
}

// Close closes every bus opened.
func (b *Buses) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, bus := range b.i2c {
		errs = append(errs, bus.Close())
	}
	b.i2c = nil
	return errors.Join(errs...)
}

// i2cBusNumber accepts 1, i2c1, i2c-1 and /dev/i2c-1.
func i2cBusNumber(name string) (int, error) {
	s := strings.ToLower(strings.TrimPrefix(name, "/dev/"))
	if rest, ok := strings.CutPrefix(s, "i2c"); ok {
		s = strings.TrimPrefix(rest, "-")
	}
	n, err := strconv.Atoi(s)
	if s == "" || s[0] < '0' || s[0] > '9' {
		err = strconv.ErrSyntax
	}
	if err != nil || n < 0 || n > 255 {
		return 0, fmt.Errorf("sensors: %q is not an I²C bus; use its number such as 1", name)
	}
	return n, nil
}

// nackBus marks the errors a Linux I²C adapter returns when no device
// acknowledges its address (EREMOTEIO, ENXIO, EIO) as ErrNoAck, so that
// they are counted as such; periph's sysfs bus keeps only their text.
type nackBus struct{ i2c.Bus }

func (n nackBus) Tx(addr uint16, w, r []byte) error {
	err := n.Bus.Tx(addr, w, r)
	if err == nil || errors.Is(err, ErrNoAck) {
		return err
	}
	if errors.Is(err, syscall.EREMOTEIO) || errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.EIO) {
		return fmt.Errorf("%w: %v", ErrNoAck, err)
	}
	msg := err.Error()
	for _, e := range []syscall.Errno{syscall.EREMOTEIO, syscall.ENXIO, syscall.EIO} {
		if strings.HasSuffix(msg, e.Error()) {
			return fmt.Errorf("%w: %v", ErrNoAck, err)
		}
	}
	return err
}

func (n nackBus) SetSpeed(f physic.Frequency) error { return n.Bus.SetSpeed(f) }

func (n nackBus) String() string { return n.Bus.String() }

// exists reports whether path exists, for error messages.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
