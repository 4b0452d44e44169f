package sensors

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
)

// Spec is one sensor's configuration as its driver's Parse sees it: typed
// accessors for the options, each recording what was asked for so that an
// unknown option is reported, and Fail for anything else wrong.
type Spec struct {
	Sensor
	Addr uint16 // the parsed I²C address, for BusI2C kinds
	// Quantities is what the device will report, when the driver knows it
	// from the configuration alone; Parse sets it so that Home Assistant
	// discovery can announce a sensor before its first reading.
	Quantities []Quantity

	path   string         // sensors[i], for problem paths
	chk    *check.Checker // where problems go
	failed int            // problems reported through Fail
	used   map[string]bool
}

// Fail records a problem with key, a path below the sensor such as
// options.mode or channels[1].input; "" means the sensor as a whole.
func (s *Spec) Fail(key, format string, args ...any) {
	p := s.path
	if key != "" {
		p += "." + key
	}
	s.failed++
	s.chk.Fail(p, format, args...)
}

// option returns the raw option and marks it known.
func (s *Spec) option(key string) (string, bool) {
	s.used[key] = true
	v, ok := s.Options[key]
	return v, ok
}

// Choice returns option key, which must be one of allowed; def when unset.
func (s *Spec) Choice(key, def string, allowed ...string) string {
	v, ok := s.option(key)
	if !ok {
		return def
	}
	if slices.Contains(allowed, v) {
		return v
	}
	s.Fail("options."+key, "%q is not allowed; use one of %s", v, strings.Join(allowed, ", "))
	return def
}

// Float returns option key as a number within [lo, hi]; def when unset.
func (s *Spec) Float(key string, def, lo, hi float64) float64 {
	v, ok := s.option(key)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < lo || f > hi {
		s.Fail("options."+key, "%q is not allowed; use a number from %g to %g, such as %g", v, lo, hi, def)
		return def
	}
	return f
}

// Duration returns option key as a duration within [lo, hi]; def when unset.
func (s *Spec) Duration(key string, def, lo, hi time.Duration) time.Duration {
	v, ok := s.option(key)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		s.Fail("options."+key, "%q is not allowed; use a duration from %s to %s, such as %s", v, lo, hi, def)
		return def
	}
	return d
}

// Bool returns option key as true or false; def when unset.
func (s *Spec) Bool(key string, def bool) bool {
	v, ok := s.option(key)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		s.Fail("options."+key, "%q is not allowed; use true or false", v)
		return def
	}
	return b
}

// Text returns option key as written; def when unset.
func (s *Spec) Text(key, def string) string {
	v, ok := s.option(key)
	if !ok {
		return def
	}
	return v
}

// parse checks one sensor, sensors[i], against its kind and returns its
// opener; problems go to k.
func parse(chk *check.Checker, i int, sc Sensor) (Kind, *Spec, Opener) {
	s := &Spec{Sensor: sc, path: fmt.Sprintf("sensors[%d]", i), chk: chk, used: map[string]bool{}}
	k, ok := lookup(sc.Kind)
	if !ok {
		if sc.Kind != "" {
			names := make([]string, 0, len(kinds))
			for _, k := range Kinds() {
				names = append(names, k.Name)
			}
			s.Fail("kind", "%q is not a known sensor kind; use one of %s", sc.Kind, strings.Join(names, ", "))
		}
		return k, s, nil
	}
	switch k.Bus {
	case BusI2C:
		if sc.Bus != "" && sc.Bus != SimBus {
			if _, err := i2cBusNumber(sc.Bus); err != nil {
				s.Fail("bus", "%q is not an I²C bus; use its number such as 1 (for /dev/i2c-1), or sim", sc.Bus)
			}
		}
		a, err := strconv.ParseUint(sc.Address, 0, 16)
		switch {
		case sc.Address == "" && len(k.Addresses) > 0:
			s.Addr = k.Addresses[0]
		case err != nil || a < 0x03 || a > 0x77:
			s.Fail("address", "%q is not a 7-bit I²C address; use one such as %s", sc.Address, hexAddrs(k.Addresses))
		case len(k.Addresses) > 0 && !slices.Contains(k.Addresses, uint16(a)):
			s.Fail("address", "a %s answers only at %s, not %s", k.Name, hexAddrs(k.Addresses), sc.Address)
		default:
			s.Addr = uint16(a)
		}
	case BusGPIO:
		if sc.Bus != "gpio" && sc.Bus != SimBus && sc.Bus != "" {
			s.Fail("bus", "%q is not allowed for %s; use gpio, or sim", sc.Bus, k.Name)
		}
		if sc.Address == "" {
			s.Fail("address", "required: the pin name, such as GPIO17")
		}
	case BusW1:
		if sc.Bus != "w1" && sc.Bus != SimBus && sc.Bus != "" {
			s.Fail("bus", "%q is not allowed for %s; use w1 (the kernel's 1-Wire bus), or sim", sc.Bus, k.Name)
		}
		if sc.Address == "" {
			s.Fail("address", "required: the 1-Wire device id as listed in /sys/bus/w1/devices, such as 28-0316a279f3ff")
		}
	}
	if len(sc.Channels) > 0 && !k.Channels {
		s.Fail("channels", "%s has no channels; remove channels", k.Name)
	}
	open := k.Parse(s)
	for _, key := range slices.Sorted(maps.Keys(sc.Options)) {
		if !s.used[key] {
			known := slices.Sorted(maps.Keys(s.used))
			hint := "it takes no options"
			if len(known) > 0 {
				hint = "known options: " + strings.Join(known, ", ")
			}
			s.Fail("options."+key, "unknown option for %s; %s", k.Name, hint)
		}
	}
	return k, s, open
}

// reservedQuantity are topic levels under a sensor that carry something
// other than a reading.
var reservedQuantity = []string{"status"}

// checkKinds reports to k what each sensor's kind finds wrong with its
// address, bus, options and channels.
func checkKinds(k *check.Checker, sensors []Sensor) {
	for i, sc := range sensors {
		_, s, _ := parse(k, i, sc)
		for j, ch := range sc.Channels {
			if slices.Contains(reservedQuantity, ch.Name) {
				s.Fail(fmt.Sprintf("channels[%d].name", j), "%q is reserved for the sensor's %s topic; choose another name", ch.Name, ch.Name)
			}
		}
	}
}

func hexAddrs(as []uint16) string {
	if len(as) == 0 {
		return "0x76"
	}
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = fmt.Sprintf("0x%02x", a)
	}
	return strings.Join(parts, " or ")
}
