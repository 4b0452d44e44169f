package sensors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/devices/v3/ads1x15"
	"periph.io/x/devices/v3/bmxx80"
)

// fuzzScratchpad is a DS18B20 scratchpad as the kernel prints it, with
// neither every byte 0xff nor every byte 0x00.
const fuzzScratchpad = "72 01 4b 46 7f ff 0e 10 57"

// FuzzW1Slave parses arbitrary text as the kernel's w1_slave file, then
// reads it through the driver. parseW1Slave must not panic; it must read
// back the temperature of every text the kernel could print; a text it
// accepts must stop being accepted when its CRC verdict turns to NO; and
// the driver must return a temperature exactly when the text is accepted,
// holds a plausible temperature and is not the power-on value, with that
// temperature.
//
//	go test -run '^$' -fuzz FuzzW1Slave -fuzztime 15s ./sensors
func FuzzW1Slave(f *testing.F) {
	for _, s := range []string{
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + " t=23125\n",
		fuzzScratchpad + " : crc=57 NO\n" + fuzzScratchpad + " t=23125\n",
		"ff ff ff ff ff ff ff ff ff : crc=c9 NO\nff ff ff ff ff ff ff ff ff t=-62\n",
		"00 00 00 00 00 00 00 00 00 : crc=00 YES\n00 00 00 00 00 00 00 00 00 t=0\n",
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + " t=85000\n",
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + " t=-10062\n",
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + " t=12345678\n",
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + " t=\n",
		fuzzScratchpad + " : crc=57 YES\n" + fuzzScratchpad + "\n",
		"hello\n",
		"",
		"\n\n",
		strings.Repeat("a", 300),
	} {
		f.Add([]byte(s))
	}
	dir := filepath.Join(f.TempDir(), "28-0316a279f3ff")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	q := Quantity{Min: -55, Max: 125}
	f.Fuzz(func(t *testing.T, text []byte) {
		in := bytes.Clone(text)
		milli, answer := parseW1Slave(text)
		if !bytes.Equal(in, text) {
			t.Fatal("parseW1Slave changed its input")
		}
		if answer < w1OK || answer > w1Shorted || answer != w1OK && milli != 0 {
			t.Fatalf("parseW1Slave(%q) = %d, %d", text, milli, answer)
		}
		if answer == w1OK {
			if milli < -9_999_999 || milli > 9_999_999 {
				t.Fatalf("parseW1Slave(%q) = %d milli-degrees: more than seven digits", text, milli)
			}
			no := bytes.Replace(text, []byte(" YES\n"), []byte(" NO\n"), 1)
			if _, a := parseW1Slave(no); !bytes.Equal(no, text) && a == w1OK {
				t.Fatalf("%q is accepted with its CRC verdict NO", no)
			}
			// What the kernel would print for this temperature reads back.
			canon := fmt.Sprintf("%s : crc=57 YES\n%s t=%d\n", fuzzScratchpad, fuzzScratchpad, milli)
			if m, a := parseW1Slave([]byte(canon)); a != w1OK || m != milli {
				t.Fatalf("the kernel's text for %d reads as %d, %d", milli, m, a)
			}
		}

		if err := os.WriteFile(filepath.Join(dir, "w1_slave"), text, 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := openDS18B20(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		vals := []float64{42}
		err = d.Read(context.Background(), vals)
		want := answer == w1OK && len(text) < len(d.buf) && milli != ds18b20PowerOn &&
			float64(milli)/1000 >= q.Min && float64(milli)/1000 <= q.Max
		switch {
		case want && err != nil:
			t.Fatalf("%q holds %d milli-degrees, yet Read fails: %v", text, milli, err)
		case !want && err == nil:
			t.Fatalf("%q (%d, answer %d) reads as %v °C", text, milli, answer, vals[0])
		case err == nil && vals[0] != float64(milli)/1000:
			t.Fatalf("%q reads as %v °C, want %v", text, vals[0], float64(milli)/1000)
		case err != nil && !math.IsNaN(vals[0]):
			t.Fatalf("a failed Read left %v in its value", vals[0])
		}
	})
}

// FuzzCommand parses an output's command payload: ON, OFF, 1 or 0, in any
// case, with space around. It must accept exactly those, and read back
// the state it reports.
//
//	go test -run '^$' -fuzz FuzzCommand -fuzztime 15s ./sensors
func FuzzCommand(f *testing.F) {
	for _, s := range []string{"ON", "off", " 1 ", "0\n", "On", "", "2", "ONN", "\u00a0ON", "oﬀ", "ON\x00", "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		on, err := parseCommand(payload)
		word := strings.ToUpper(strings.TrimSpace(string(payload)))
		switch {
		case err != nil && (word == "ON" || word == "OFF" || word == "1" || word == "0"):
			t.Fatalf("%q refused: %v", payload, err)
		case err != nil:
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", payload)) {
				t.Fatalf("the error %q does not quote the payload", err)
			}
			return
		case word != "ON" && word != "OFF" && word != "1" && word != "0":
			t.Fatalf("%q accepted as %v", payload, on)
		case on != (word == "ON" || word == "1"):
			t.Fatalf("%q read as %v", payload, on)
		}
		if back, err := parseCommand([]byte(onOff(on))); err != nil || back != on {
			t.Fatalf("the state %s reads back as %v, %v", onOff(on), back, err)
		}
	})
}

// FuzzSHTWords has an SHT3x and an SHT4x answer a measurement with
// arbitrary bytes. Read must succeed exactly when both words carry their
// CRC and at least one value is plausible, with the datasheets' formulas,
// and a value outside its range must come back NaN.
//
//	go test -run '^$' -fuzz FuzzSHTWords -fuzztime 15s ./sensors
func FuzzSHTWords(f *testing.F) {
	word := func(hi, lo byte) []byte { return []byte{hi, lo, sensirionCRC([]byte{hi, lo})} }
	f.Add(append(word(0x66, 0x66), word(0x80, 0x00)...), false)
	f.Add(append(word(0x66, 0x66), word(0x80, 0x00)...), true)
	f.Add(append(word(0xff, 0xff), word(0xff, 0xff)...), false)
	f.Add(append(word(0x00, 0x00), word(0x00, 0x00)...), true)
	f.Add([]byte{0x66, 0x66, 0x00, 0x80, 0x00, 0x00}, false)
	f.Add([]byte{0xbe, 0xef, 0x92}, true) // the datasheet's CRC example, then nothing
	f.Fuzz(func(t *testing.T, answer []byte, four bool) {
		m := sht3x
		if four {
			m = sht4x
		}
		var served [6]byte
		copy(served[:], answer)
		d := &shtDevice{model: m, bus: &fuzzAnswerBus{answer: served[:]}, addr: 0x44, cmd: m.measure[0], name: "fuzz", timer: time.NewTimer(time.Hour)}
		d.timer.Stop()
		d.qs = []Quantity{
			{Name: "temperature", Min: -40, Max: 125},
			{Name: "humidity", Min: 0, Max: 100},
		}
		vals := make([]float64, 2)
		err := d.Read(context.Background(), vals)
		crcOK := sensirionCRC(served[0:2]) == served[2] && sensirionCRC(served[3:5]) == served[5]
		temp := -45 + 175*float64(uint16(served[0])<<8|uint16(served[1]))/65535
		hum := m.humidity(uint16(served[3])<<8 | uint16(served[4]))
		plausible := []bool{temp >= -40 && temp <= 125, hum >= 0 && hum <= 100}
		switch {
		case !crcOK:
			if !errors.Is(err, ErrCRC) {
				t.Fatalf("words % x with a bad CRC: %v, want ErrCRC", served, err)
			}
		case !plausible[0] && !plausible[1]:
			if !errors.Is(err, ErrImplausible) {
				t.Fatalf("%v °C and %v %%: %v, want ErrImplausible", temp, hum, err)
			}
		case err != nil:
			t.Fatalf("words % x: %v", served, err)
		default:
			for i, want := range []float64{temp, hum} {
				if !plausible[i] {
					want = math.NaN()
				}
				if got := vals[i]; got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
					t.Fatalf("value %d is %v, want %v", i, got, want)
				}
			}
		}
	})
}

// fuzzAnswerBus answers every read with answer and acknowledges every write.
type fuzzAnswerBus struct{ answer []byte }

func (b *fuzzAnswerBus) Tx(_ uint16, _, r []byte) error {
	copy(r, b.answer)
	return nil
}
func (b *fuzzAnswerBus) SetSpeed(physic.Frequency) error { return nil }
func (b *fuzzAnswerBus) String() string                  { return "fuzz" }

// fuzzBus is an I²C bus whose devices answer with fuzz bytes: each
// transaction takes one byte that decides whether it is acknowledged
// (0xff: no), then as many bytes as it reads. Once the bytes or its
// transaction budget run out, nothing answers, so that a driver polling
// for a ready bit stops.
type fuzzBus struct {
	b     []byte
	calls int
}

// fuzzBusBudget bounds the transactions of one fuzz input.
const fuzzBusBudget = 200

func (b *fuzzBus) Tx(addr uint16, w, r []byte) error {
	b.calls++
	if len(b.b) == 0 || b.calls > fuzzBusBudget {
		return fmt.Errorf("fuzz bus: 0x%02x: %w", addr, ErrNoAck)
	}
	c := b.b[0]
	b.b = b.b[1:]
	if c == 0xff {
		return fmt.Errorf("fuzz bus: 0x%02x: %w", addr, ErrNoAck)
	}
	n := copy(r, b.b)
	clear(r[n:])
	b.b = b.b[n:]
	return nil
}
func (b *fuzzBus) SetSpeed(physic.Frequency) error { return nil }
func (b *fuzzBus) String() string                  { return "fuzz" }

var _ i2c.Bus = (*fuzzBus)(nil)

// FuzzI2CDevices opens each I²C driver on a bus whose chips answer with
// fuzz bytes, reads it twice and closes it, then scans the bus as
// `fieldgate sensors scan` does. The first byte picks the driver. Nothing
// may panic or hang; a Read that succeeds reports each value NaN or
// within its quantity's range, and not all of them NaN.
//
//	go test -run '^$' -fuzz FuzzI2CDevices -fuzztime 15s ./sensors
func FuzzI2CDevices(f *testing.F) {
	ok := func(b ...byte) []byte { return append([]byte{0}, b...) }
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	word := func(hi, lo byte) []byte { return []byte{hi, lo, sensirionCRC([]byte{hi, lo})} }
	// SHT3x: reset, status command, status word; then measure and read.
	f.Add(join([]byte{0}, ok(), ok(), ok(word(0x00, 0x10)...), ok(), ok(append(word(0x66, 0x66), word(0x80, 0)...)...)))
	// SHT4x: reset, serial command, serial words; then measure and read.
	f.Add(join([]byte{1}, ok(), ok(), ok(append(word(1, 2), word(3, 4)...)...), ok(), ok(append(word(0x66, 0x66), word(0x80, 0)...)...)))
	f.Add(join([]byte{1}, ok(), ok(), ok(1, 2, 0, 3, 4, 0)))
	// INA219, ADS1115 and the Bosch chips, on answers of zeros and then
	// of every byte set.
	for kind := byte(2); kind < fuzzI2CKinds; kind++ {
		f.Add(append([]byte{kind}, make([]byte, 64)...))
		f.Add(append([]byte{kind}, bytes.Repeat([]byte{0x7f}, 64)...))
		f.Add(append([]byte{kind}, ok(bme280ID)...))
		f.Add(append([]byte{kind}, ok(bmp280ID)...))
	}
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		bus := &fuzzBus{b: data[1:]}
		dev, err := fuzzOpen(data[0]%fuzzI2CKinds, bus)
		if err == nil {
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				qs := dev.Quantities()
				vals := make([]float64, len(qs))
				err := dev.Read(ctx, vals)
				cancel()
				if err != nil {
					continue
				}
				usable := 0
				for i, q := range qs {
					switch v := vals[i]; {
					case math.IsNaN(v):
					case v < q.Min || v > q.Max:
						t.Fatalf("%s: %s is %v, outside %v..%v, and Read succeeded", dev, q.Name, v, q.Min, q.Max)
					default:
						usable++
					}
				}
				if usable == 0 {
					t.Fatalf("%s: Read succeeded with no usable value: %v", dev, vals)
				}
			}
			_ = dev.Close()
		}
		bus.calls = 0
		if err := WriteGrid(io.Discard, Scan(bus)); err != nil {
			t.Fatal(err)
		}
	})
}

// fuzzI2CKinds is the number of drivers fuzzOpen knows.
const fuzzI2CKinds = 7

// fuzzOpen opens driver kind on bus, with the options that keep a read
// short: the lowest precision, the fastest data rate, one oversampling.
func fuzzOpen(kind byte, bus i2c.Bus) (Device, error) {
	switch kind {
	case 0, 1:
		m := sht3x
		if kind == 1 {
			m = sht4x
		}
		d, err := m.open(bus, 0x44, 2)
		if err != nil {
			return nil, err
		}
		d.convTime = 0 // the bus answers at once
		return d, nil
	case 2:
		d, err := openINA219(bus, 0x40, 100*physic.MilliOhm, 3200*physic.MilliAmpere)
		if err != nil {
			return nil, err
		}
		d.(*ina219Dev).ready = time.Now() // no conversion to wait for
		return d, nil
	case 3, 4:
		name := "ads1115"
		if kind == 4 {
			name = "ads1015"
		}
		qs := []Quantity{{Name: "v", Min: -10, Max: 10}, {Name: "w", Min: 0, Max: 1}}
		ins := []ads1x15Input{{mux: ads1x15.Channel0, scale: 1}, {mux: ads1x15.Channel0Minus1, scale: 0.25, offset: 0.5}}
		return openADS1x15(bus, name, 0x48, 4.096, 860, ins, qs)
	default:
		opts := bmxx80.Opts{Temperature: bmxx80.O1x, Pressure: bmxx80.O1x, Humidity: bmxx80.O1x}
		if kind == 6 {
			opts.Humidity = bmxx80.Off
		}
		return openBMx280(bus, 0x76, kind == 5, opts, bmxx80.F2)
	}
}
