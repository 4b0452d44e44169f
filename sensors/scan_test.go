package sensors

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/sensors/sim"
	"periph.io/x/conn/v3/physic"
)

// scanWorld is simulated hardware on a stopped clock.
func scanWorld() *sim.World {
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	return sim.New(1, sim.WithClock(func() time.Time { return at }))
}

func foundAddrs(found []Found) []uint16 {
	as := make([]uint16, len(found))
	for i, f := range found {
		as[i] = f.Addr
	}
	return as
}

// TestScanSimBus scans the simulated bus, through the bus wrapper the
// gateway uses, and expects its four chips, no other address, the chip
// ids read where they can be, and the registered kinds as they stand.
func TestScanSimBus(t *testing.T) {
	bus, err := (&Buses{Sim: scanWorld()}).I2C(SimBus)
	if err != nil {
		t.Fatal(err)
	}
	found := Scan(bus)
	want := []uint16{0x40, 0x44, 0x48, 0x76}
	if got := foundAddrs(found); !slices.Equal(got, want) {
		t.Fatalf("found %#x, want %#x", got, want)
	}
	chips := map[uint16]string{0x40: "", 0x44: "SHT3x", 0x48: "", 0x76: "BME280"}
	for _, f := range found {
		if f.Chip != chips[f.Addr] {
			t.Errorf("0x%02x: chip %q, want %q", f.Addr, f.Chip, chips[f.Addr])
		}
		// The kinds registered now, whichever drivers exist: all those at
		// the address, or only the one the chip names.
		var kinds []string
		for _, k := range Kinds() {
			if k.Bus == BusI2C && slices.Contains(k.Addresses, f.Addr) {
				kinds = append(kinds, k.Name)
			}
		}
		if name := strings.ToLower(f.Chip); slices.Contains(kinds, name) {
			kinds = []string{name}
		}
		if !slices.Equal(f.Kinds, kinds) {
			t.Errorf("0x%02x: kinds %q, want %q", f.Addr, f.Kinds, kinds)
		}
	}
}

// TestScanNamesKinds scans with a fixed list of kinds, so that naming is
// tested whatever drivers are registered.
func TestScanNamesKinds(t *testing.T) {
	kinds := []Kind{
		{Name: "adc", Bus: BusI2C, Addresses: []uint16{0x48, 0x49}},
		{Name: "bme280", Bus: BusI2C, Addresses: []uint16{0x76, 0x77}},
		{Name: "bmp280", Bus: BusI2C, Addresses: []uint16{0x76, 0x77}},
		{Name: "meter", Bus: BusI2C, Addresses: []uint16{0x40, 0x44}},
		{Name: "sht3x", Bus: BusI2C, Addresses: []uint16{0x44, 0x45}},
		{Name: "pin", Bus: BusGPIO},
	}
	w := scanWorld()
	found := scan(w.I2C(), kinds)
	want := map[uint16][]string{0x40: {"meter"}, 0x44: {"sht3x"}, 0x48: {"adc"}, 0x76: {"bme280"}}
	if len(found) != len(want) {
		t.Fatalf("found %#x, want the four chips", foundAddrs(found))
	}
	for _, f := range found {
		if !slices.Equal(f.Kinds, want[f.Addr]) {
			t.Errorf("0x%02x: kinds %q, want %q", f.Addr, f.Kinds, want[f.Addr])
		}
	}

	// A chip taken off the bus is not found.
	if err := w.SetPresent(0x48, false); err != nil {
		t.Fatal(err)
	}
	if got := foundAddrs(scan(w.I2C(), kinds)); slices.Contains(got, 0x48) {
		t.Errorf("found %#x with 0x48 removed", got)
	}
}

// scanTestBus answers reads at the addresses in regs with those
// registers' contents and refuses everything else, as an empty address
// on Linux does.
type scanTestBus struct {
	regs map[uint16]map[byte]byte
	log  []string
}

func (b *scanTestBus) Tx(addr uint16, w, r []byte) error {
	regs, ok := b.regs[addr]
	if !ok {
		return syscall.EREMOTEIO
	}
	if len(w) > 0 {
		b.log = append(b.log, fmt.Sprintf("0x%02x % x", addr, w))
	}
	for i := range r {
		if len(w) > 0 {
			r[i] = regs[w[0]+byte(i)]
		}
	}
	return nil
}

func (b *scanTestBus) SetSpeed(physic.Frequency) error { return nil }

func (b *scanTestBus) String() string { return "scan-test" }

// TestScanRange expects the addresses i2cdetect scans, 0x03 to 0x77, and
// none of the reserved ones around them.
func TestScanRange(t *testing.T) {
	bus := &scanTestBus{regs: map[uint16]map[byte]byte{}}
	for _, a := range []uint16{0x00, 0x02, 0x03, 0x50, 0x77, 0x78, 0x7f} {
		bus.regs[a] = map[byte]byte{}
	}
	if got := foundAddrs(scan(bus, nil)); !slices.Equal(got, []uint16{0x03, 0x50, 0x77}) {
		t.Errorf("found %#x, want 0x03 0x50 0x77", got)
	}
	if !slices.Equal(bus.log, []string{"0x77 d0"}) {
		t.Errorf("writes %q, want only the chip id read at 0x77", bus.log)
	}
}

func TestScanIdentifiesBoschChips(t *testing.T) {
	bus := &scanTestBus{regs: map[uint16]map[byte]byte{
		0x23: {},
		0x76: {0xd0: 0x12}, // not a Bosch id
		0x77: {0xd0: 0x58},
	}}
	found := scan(bus, []Kind{{Name: "bme280", Bus: BusI2C, Addresses: []uint16{0x76, 0x77}}})
	if got := foundAddrs(found); !slices.Equal(got, []uint16{0x23, 0x76, 0x77}) {
		t.Fatalf("found %#x", got)
	}
	if found[1].Chip != "" || found[2].Chip != "BMP280" || found[2].How != "chip id 0x58" {
		t.Errorf("chips %+v", found)
	}
	if !slices.Equal(bus.log, []string{"0x76 d0", "0x77 d0"}) {
		t.Errorf("writes %q, want the two chip id reads", bus.log)
	}
	var b bytes.Buffer
	if err := WriteGrid(&b, found); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"0x23  no registered kind uses this address\n",
		"0x76  likely kind bme280\n",
		"0x77  BMP280 (chip id 0x58): likely kind bme280\n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("grid lacks %q:\n%s", line, b.String())
		}
	}
}

func TestScanGrid(t *testing.T) {
	found := []Found{
		{Addr: 0x03},
		{Addr: 0x40, Kinds: []string{"ina219"}},
		{Addr: 0x44, Chip: "SHT3x", How: "status register", Kinds: []string{"sht3x"}},
		{Addr: 0x48, Kinds: []string{"ads1015", "ads1115"}},
		{Addr: 0x76, Chip: "BME280", How: "chip id 0x60", Kinds: []string{"bme280"}},
		{Addr: 0x77},
	}
	var b bytes.Buffer
	if err := WriteGrid(&b, found); err != nil {
		t.Fatal(err)
	}
	want := `     0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f
00:          03 -- -- -- -- -- -- -- -- -- -- -- --
10: -- -- -- -- -- -- -- -- -- -- -- -- -- -- -- --
20: -- -- -- -- -- -- -- -- -- -- -- -- -- -- -- --
30: -- -- -- -- -- -- -- -- -- -- -- -- -- -- -- --
40: 40 -- -- -- 44 -- -- -- 48 -- -- -- -- -- -- --
50: -- -- -- -- -- -- -- -- -- -- -- -- -- -- -- --
60: -- -- -- -- -- -- -- -- -- -- -- -- -- -- -- --
70: -- -- -- -- -- -- 76 77

0x03  no registered kind uses this address
0x40  likely kind ina219
0x44  SHT3x (status register): kind sht3x
0x48  likely kind ads1015 or ads1115
0x76  BME280 (chip id 0x60): kind bme280
0x77  no registered kind uses this address
`
	if b.String() != want {
		t.Errorf("grid:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := WriteGrid(&b, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), "70: -- -- -- -- -- -- -- --\n\nno device answered\n") {
		t.Errorf("empty grid:\n%s", b.String())
	}
	if err := WriteGrid(failingWriter{}, found); err == nil {
		t.Error("a failing writer's error was lost")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }
