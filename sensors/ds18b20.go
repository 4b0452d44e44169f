package sensors

// Maxim DS18B20 (and the DS1822 and DS1825, which answer alike) 1-Wire
// temperature sensors, read through the Linux kernel's w1 driver rather
// than by bit-banging the bus: the kernel owns the timing-critical part
// (w1-gpio overlay) and lists each sensor it finds as a directory such as
// /sys/bus/w1/devices/28-0316a279f3ff. Reading that directory's w1_slave
// file makes the kernel start a conversion, wait for it (750 ms at 12
// bits) and print the scratchpad:
//
//	72 01 4b 46 7f ff 0e 10 57 : crc=57 YES
//	72 01 4b 46 7f ff 0e 10 57 t=23125
//
// The first line carries the kernel's verdict on the scratchpad's CRC,
// the second the temperature in milli-degrees Celsius.
//
// The file is kept open and read again from offset 0, which makes sysfs
// print it afresh; this keeps a reading free of allocations. When the
// sensor is unplugged the kernel removes its directory and reads of the
// open file fail; after any failed read the file is closed and opened
// again on the next reading, so a sensor plugged back in is found.
//
// The kernel's read cannot be interrupted: Read checks ctx before it
// starts, and the default two-second timeout covers the conversion.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// ds18b20Kind is the kind this file drives, listed in the table in kinds.go.
var ds18b20Kind = Kind{
	Name:  "ds18b20",
	Doc:   "Maxim DS18B20 (also DS1822, DS1825) temperature, through the kernel's 1-Wire driver",
	Bus:   BusW1,
	Parse: parseDS18B20,
}

// ds18b20Families are the 1-Wire family codes of the chips this driver
// reads: DS18B20, DS1822 and DS1825.
var ds18b20Families = []string{"28", "22", "3b"}

// ds18b20PowerOn is the temperature register's value after power-on, in
// milli-degrees: reading it means no conversion took place (a brown-out,
// or parasite power without a strong pull-up), not that it is 85 °C.
const ds18b20PowerOn = 85000

func parseDS18B20(s *Spec) Opener {
	id := s.Address
	if id != "" {
		if msg := checkW1ID(id); msg != "" {
			s.Fail("address", "%s", msg)
		}
	}
	return func(c Conn) (Device, error) { return openDS18B20(c.W1Dir, id) }
}

// checkW1ID returns what is wrong with id as the kernel's name for a
// DS18B20, or "" when it is right.
func checkW1ID(id string) string {
	switch {
	case !isW1ID(id) && isW1ID(strings.ToLower(id)):
		return fmt.Sprintf("%q has capital letters; write it in lowercase as /sys/bus/w1/devices lists it: %s", id, strings.ToLower(id))
	case !isW1ID(id):
		return fmt.Sprintf("%q is not a 1-Wire device id; use the family code, a dash and 12 hex digits as listed in /sys/bus/w1/devices, such as 28-0316a279f3ff", id)
	case !slices.Contains(ds18b20Families, id[:2]):
		return fmt.Sprintf("%q has family code %s, which is not a DS18B20; use an id beginning 28- (DS18B20), 22- (DS1822) or 3b- (DS1825)", id, id[:2])
	}
	return ""
}

// isW1ID reports whether id has the kernel's form for a 1-Wire device:
// two hex digits of family code, a dash, twelve of serial number, all
// lowercase.
func isW1ID(id string) bool {
	if len(id) != 15 || id[2] != '-' {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if i != 2 && (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ds18b20 is one opened sensor.
type ds18b20 struct {
	name string // ds18b20 and its id
	path string // its w1_slave file
	qs   []Quantity
	f    *os.File // nil until opened, and after a failed read
	// buf holds one w1_slave text, about 75 bytes; a text that fills it
	// is not one.
	buf [256]byte
}

func openDS18B20(dir, id string) (*ds18b20, error) {
	if id == "" {
		id = filepath.Base(dir)
	}
	d := &ds18b20{
		name: "ds18b20 " + id,
		path: filepath.Join(dir, "w1_slave"),
		qs:   []Quantity{{Name: "temperature", Unit: "°C", Decimals: 2, Min: -55, Max: 125, Class: "temperature"}},
	}
	if dir == "" {
		return nil, fmt.Errorf("sensors: %s: no 1-Wire device directory to open it in", d.name)
	}
	if err := d.openFile(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *ds18b20) openFile() error {
	f, err := os.Open(d.path)
	if err != nil {
		return d.ioError(err)
	}
	d.f = f
	return nil
}

// ioError wraps a failure to open or read w1_slave; the ones that mean
// the sensor has gone wrap ErrNoAck.
func (d *ds18b20) ioError(err error) error {
	gone := errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) ||
		errors.Is(err, syscall.ENXIO) || errors.Is(err, syscall.EIO)
	if !gone {
		return fmt.Errorf("sensors: %s: %w", d.name, err)
	}
	devices := filepath.Dir(filepath.Dir(d.path))
	hint := "is the sensor connected? the kernel lists the 1-Wire devices it finds in " + devices
	if !exists(devices) {
		hint = devices + " does not exist: enable the kernel's 1-Wire bus, such as with dtoverlay=w1-gpio in config.txt"
	}
	return fmt.Errorf("sensors: %s: %v: %w (%s)", d.name, err, ErrNoAck, hint)
}

// Quantities reports the temperature.
func (d *ds18b20) Quantities() []Quantity { return d.qs }

// Read has the kernel take a conversion and reads it.
func (d *ds18b20) Read(ctx context.Context, vals []float64) error {
	vals[0] = math.NaN()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sensors: %s: %w", d.name, err)
	}
	if d.f == nil {
		if err := d.openFile(); err != nil {
			return err
		}
	}
	n, err := d.f.ReadAt(d.buf[:], 0)
	if err != nil && err != io.EOF {
		d.closeFile()
		return d.ioError(err)
	}
	milli, answer := parseW1Slave(d.buf[:n])
	if answer == w1Garbled || n == len(d.buf) {
		d.closeFile()
		return fmt.Errorf("sensors: %s: %s reads %q; want two lines, the first ending crc=xx YES and the second t= and milli-degrees",
			d.name, d.path, truncateText(d.buf[:n], 100))
	}
	switch answer {
	case w1NoDevice:
		return fmt.Errorf("sensors: %s: every scratchpad byte read 0xff, so no device drove the bus: %w (is the sensor connected?)", d.name, ErrNoAck)
	case w1Shorted:
		return fmt.Errorf("sensors: %s: every scratchpad byte read 0x00, so the data line is held low: %w (check the wiring and the pull-up resistor)", d.name, ErrNoAck)
	case w1CRCFailed:
		return fmt.Errorf("sensors: %s: the kernel found the scratchpad's CRC wrong (crc=.. NO): %w (a long or unshielded cable, or a weak pull-up?)", d.name, ErrCRC)
	}
	if milli == ds18b20PowerOn {
		return fmt.Errorf("sensors: %s: 85 °C is the chip's power-on value, so no conversion took place (a brown-out, or parasite power without a strong pull-up?): %w", d.name, ErrImplausible)
	}
	vals[0] = float64(milli) / 1000
	if err := dropImplausible(d.qs, vals); err != nil {
		return fmt.Errorf("sensors: %s: %w", d.name, err)
	}
	return nil
}

// Close closes w1_slave.
func (d *ds18b20) Close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

func (d *ds18b20) closeFile() { _ = d.Close() }

// String names the sensor by its 1-Wire id.
func (d *ds18b20) String() string { return d.name }

// w1Answer is what the kernel's w1_slave text says.
type w1Answer int

const (
	w1OK        w1Answer = iota // a scratchpad with a good CRC and a temperature
	w1Garbled                   // not the text the kernel prints
	w1CRCFailed                 // crc=xx NO
	w1NoDevice                  // every byte 0xff: nothing pulled the bus low
	w1Shorted                   // every byte 0x00: the bus never went high
)

var (
	w1CRCMark = []byte(": crc=")
	w1TempKey = []byte("t=")
	w1Yes     = []byte(" YES")
	w1No      = []byte(" NO")
)

// parseW1Slave reads the kernel's w1_slave text without allocating and
// returns the temperature in milli-degrees.
func parseW1Slave(b []byte) (milli int, a w1Answer) {
	first, second, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return 0, w1Garbled
	}
	second = bytes.TrimRight(second, "\n")
	if bytes.IndexByte(second, '\n') >= 0 {
		return 0, w1Garbled
	}
	pad, verdict, ok := bytes.Cut(first, w1CRCMark)
	if !ok {
		return 0, w1Garbled
	}
	n, ff, zero := 0, 0, 0
	for f := range bytes.FieldsSeq(pad) {
		if len(f) != 2 || !isHex(f[0]) || !isHex(f[1]) {
			return 0, w1Garbled
		}
		n++
		switch string(f) {
		case "ff":
			ff++
		case "00":
			zero++
		}
	}
	i := bytes.LastIndex(second, w1TempKey)
	if n == 0 || i < 0 {
		return 0, w1Garbled
	}
	milli, ok = parseMilli(second[i+len(w1TempKey):])
	if !ok {
		return 0, w1Garbled
	}
	switch {
	case ff == n:
		return 0, w1NoDevice
	case zero == n:
		return 0, w1Shorted
	case bytes.HasSuffix(verdict, w1No):
		return 0, w1CRCFailed
	case !bytes.HasSuffix(verdict, w1Yes):
		return 0, w1Garbled
	}
	return milli, w1OK
}

// parseMilli parses an optionally negative decimal integer of at most
// seven digits, all of b.
func parseMilli(b []byte) (int, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 7 {
		return 0, false
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

// truncateText shortens b for an error message.
func truncateText(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
