package sensors

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const ds18b20YAML = "sensors:\n  - {name: tank, kind: ds18b20, bus: w1, address: 28-0316a279f3ff, interval: 30s}\n"

// w1Texts are w1_slave files as the kernel prints them.
var w1Texts = map[string]string{
	"23.125":  "72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t=23125\n",
	"-10.125": "5e ff 4b 46 7f ff 02 10 2f : crc=2f YES\n5e ff 4b 46 7f ff 02 10 2f t=-10125\n",
	"crc NO":  "72 01 4b 46 7f ff 0e 10 58 : crc=57 NO\n72 01 4b 46 7f ff 0e 10 58 t=23125\n",
	"85000":   "50 05 4b 46 7f ff 0c 10 1c : crc=1c YES\n50 05 4b 46 7f ff 0c 10 1c t=85000\n",
	"130000":  "20 08 4b 46 7f ff 0c 10 9e : crc=9e YES\n20 08 4b 46 7f ff 0c 10 9e t=130000\n",
	"all ff":  "ff ff ff ff ff ff ff ff ff : crc=c9 NO\nff ff ff ff ff ff ff ff ff t=-62\n",
	"all 00":  "00 00 00 00 00 00 00 00 00 : crc=00 YES\n00 00 00 00 00 00 00 00 00 t=0\n",
	"garbage": "hello\n",
	"no t=":   "72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57\n",
	"empty":   "",
}

// w1Fixture is a fake /sys/bus/w1/devices holding one sensor's directory.
type w1Fixture struct {
	devices, dir string
}

func newW1Fixture(t *testing.T) w1Fixture {
	t.Helper()
	devices := filepath.Join(t.TempDir(), "devices")
	f := w1Fixture{devices: devices, dir: filepath.Join(devices, "28-0316a279f3ff")}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// write replaces the w1_slave text in place, as sysfs does on each read.
func (f w1Fixture) write(t *testing.T, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, "w1_slave"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func openDS18B20ForTest(t *testing.T, dir string) (Device, error) {
	t.Helper()
	ps, open := parseSensorYAML(t, ds18b20YAML, nil)
	if len(ps) > 0 {
		t.Fatalf("problems: %+v", ps)
	}
	dev, err := open(Conn{W1Dir: dir})
	if err == nil {
		t.Cleanup(func() { dev.Close() })
	}
	return dev, err
}

// openW1 makes a fake devices directory whose sensor prints text, and
// opens the sensor in it.
func openW1(t *testing.T, text string) (w1Fixture, Device) {
	t.Helper()
	fx := newW1Fixture(t)
	fx.write(t, w1Texts[text])
	dev, err := openDS18B20ForTest(t, fx.dir)
	if err != nil {
		t.Fatal(err)
	}
	return fx, dev
}

func TestDS18B20Read(t *testing.T) {
	for _, tc := range []struct {
		text    string
		want    float64 // NaN for none
		reason  string  // "" for no error
		message string
	}{
		{"23.125", 23.125, "", ""},
		{"-10.125", -10.125, "", ""},
		{"crc NO", math.NaN(), ReasonCRC, "CRC wrong"},
		{"85000", math.NaN(), ReasonImplausible, "85 °C is the chip's power-on value"},
		{"130000", math.NaN(), ReasonImplausible, "temperature 130°C outside -55..125"},
		{"all ff", math.NaN(), ReasonNoAck, "every scratchpad byte read 0xff"},
		{"all 00", math.NaN(), ReasonNoAck, "held low"},
		{"garbage", math.NaN(), ReasonOther, `w1_slave reads "hello\n"; want two lines`},
		{"no t=", math.NaN(), ReasonOther, "want two lines"},
		{"empty", math.NaN(), ReasonOther, `reads ""`},
	} {
		t.Run(tc.text, func(t *testing.T) {
			_, dev := openW1(t, tc.text)
			vals := []float64{-1000}
			err := dev.Read(context.Background(), vals)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("Read: %v", err)
			case tc.reason != "" && (err == nil || Reason(err) != tc.reason):
				t.Fatalf("Read = %v; want reason %s", err, tc.reason)
			case err != nil && !strings.Contains(err.Error(), tc.message):
				t.Errorf("message %q lacks %q", err, tc.message)
			}
			if math.IsNaN(tc.want) != math.IsNaN(vals[0]) || !math.IsNaN(tc.want) && math.Abs(vals[0]-tc.want) > 1e-9 {
				t.Errorf("vals[0] = %v, want %v", vals[0], tc.want)
			}
		})
	}
}

func TestDS18B20ReadsAfreshEachTime(t *testing.T) {
	fx, dev := openW1(t, "23.125")
	vals := []float64{0}
	for _, tc := range []struct {
		text string
		want float64
	}{{"23.125", 23.125}, {"-10.125", -10.125}, {"23.125", 23.125}} {
		fx.write(t, w1Texts[tc.text])
		if err := dev.Read(context.Background(), vals); err != nil {
			t.Fatal(err)
		}
		if vals[0] != tc.want {
			t.Errorf("read %v, want %v", vals[0], tc.want)
		}
	}
}

func TestDS18B20Unplugged(t *testing.T) {
	t.Run("no directory at open", func(t *testing.T) {
		fx := newW1Fixture(t)
		missing := filepath.Join(fx.devices, "28-000000000001")
		_, err := openDS18B20ForTest(t, missing)
		if !errors.Is(err, ErrNoAck) || Reason(err) != ReasonNoAck {
			t.Fatalf("open = %v; want ErrNoAck", err)
		}
		msg := err.Error()
		if !strings.Contains(msg, filepath.Join(missing, "w1_slave")) || !strings.Contains(msg, "is the sensor connected?") {
			t.Errorf("message %q names neither the path nor the remedy", msg)
		}
	})
	t.Run("no w1 bus at all", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "w1", "devices", "28-0316a279f3ff")
		_, err := openDS18B20ForTest(t, missing)
		if !errors.Is(err, ErrNoAck) || !strings.Contains(err.Error(), "dtoverlay=w1-gpio") {
			t.Fatalf("open = %v; want ErrNoAck telling to enable the w1 bus", err)
		}
	})
	t.Run("gone and back", func(t *testing.T) {
		fx, dev := openW1(t, "23.125")
		vals := []float64{0}
		// A failed read closes the file; with the directory gone the next
		// read cannot open it again; once it is back, reading works.
		fx.write(t, w1Texts["garbage"])
		if err := dev.Read(context.Background(), vals); Reason(err) != ReasonOther {
			t.Fatalf("garbage: %v", err)
		}
		if err := os.RemoveAll(fx.dir); err != nil {
			t.Fatal(err)
		}
		err := dev.Read(context.Background(), vals)
		if !errors.Is(err, ErrNoAck) || !strings.Contains(err.Error(), fx.dir) {
			t.Fatalf("gone: Read = %v; want ErrNoAck naming %s", err, fx.dir)
		}
		if err := os.MkdirAll(fx.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		fx.write(t, w1Texts["-10.125"])
		if err := dev.Read(context.Background(), vals); err != nil || vals[0] != -10.125 {
			t.Fatalf("back: Read = %v, %v", vals, err)
		}
	})
}

func TestDS18B20Context(t *testing.T) {
	_, dev := openW1(t, "23.125")
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	vals := []float64{0}
	if err := dev.Read(ctx, vals); Reason(err) != ReasonTimeout || !math.IsNaN(vals[0]) {
		t.Errorf("Read = %v, %v; want a timeout and NaN", vals, err)
	}
}

func TestDS18B20Parse(t *testing.T) {
	for _, id := range []string{"28-0316a279f3ff", "22-000000b2c3d4", "3b-4c0000123abc"} {
		ps, _ := parseSensorYAML(t, ds18b20YAML, func(sc *Sensor) { sc.Address = id })
		if len(ps) != 0 {
			t.Errorf("%s: %+v", id, ps)
		}
	}
	for _, tc := range []struct {
		edit       func(*Sensor)
		path, want string
	}{
		{func(sc *Sensor) { sc.Address = "10-0008019e3c1a" },
			"sensors[0].address", `"10-0008019e3c1a" has family code 10, which is not a DS18B20; use an id beginning 28- (DS18B20), 22- (DS1822) or 3b- (DS1825)`},
		{func(sc *Sensor) { sc.Address = "28-0316A279F3FF" },
			"sensors[0].address", "write it in lowercase as /sys/bus/w1/devices lists it: 28-0316a279f3ff"},
		{func(sc *Sensor) { sc.Address = "28-0316a279f3f" },
			"sensors[0].address", "is not a 1-Wire device id; use the family code, a dash and 12 hex digits"},
		{func(sc *Sensor) { sc.Address = "280316a279f3ff0" },
			"sensors[0].address", "is not a 1-Wire device id"},
		{func(sc *Sensor) { sc.Address = "" },
			"sensors[0].address", "required: the 1-Wire device id"},
		{func(sc *Sensor) { sc.Bus = "1" },
			"sensors[0].bus", `"1" is not allowed for ds18b20; use w1`},
		{withOptions(map[string]string{"resolution": "12"}),
			"sensors[0].options.resolution", "unknown option for ds18b20; it takes no options"},
	} {
		ps, _ := parseSensorYAML(t, ds18b20YAML, tc.edit)
		wantProblem(t, ps, tc.path, tc.want)
	}
}

func TestDS18B20Quantities(t *testing.T) {
	_, dev := openW1(t, "23.125")
	want := Quantity{Name: "temperature", Unit: "°C", Decimals: 2, Min: -55, Max: 125, Class: "temperature"}
	if qs := dev.Quantities(); len(qs) != 1 || qs[0] != want {
		t.Errorf("Quantities = %+v, want %+v", qs, want)
	}
	if got := dev.String(); got != "ds18b20 28-0316a279f3ff" {
		t.Errorf("String = %q", got)
	}
}

func TestDS18B20ReadAllocs(t *testing.T) {
	_, dev := openW1(t, "23.125")
	ctx := context.Background()
	vals := []float64{0}
	var readErr error
	allocs := testing.AllocsPerRun(100, func() {
		if err := dev.Read(ctx, vals); err != nil {
			readErr = err
		}
	})
	if readErr != nil || vals[0] != 23.125 {
		t.Fatalf("Read = %v, %v", vals, readErr)
	}
	if allocs != 0 {
		t.Errorf("Read allocates %.1f times; want 0", allocs)
	}
}

func TestDS18B20ParseW1Slave(t *testing.T) {
	for _, tc := range []struct {
		text  string
		milli int
		want  w1Answer
	}{
		{w1Texts["23.125"], 23125, w1OK},
		{w1Texts["-10.125"], -10125, w1OK},
		{w1Texts["crc NO"], 0, w1CRCFailed},
		{w1Texts["all ff"], 0, w1NoDevice},
		{w1Texts["all 00"], 0, w1Shorted},
		{"72 01 : crc=57 MAYBE\n72 01 t=23125\n", 0, w1Garbled},
		{"72 01 : crc=57 YES\n72 01 t=23125\nthird line\n", 0, w1Garbled},
		{"72 01 : crc=57 YES\n72 01 t=23x25\n", 0, w1Garbled},
		{"72 01 : crc=57 YES\n72 01 t=\n", 0, w1Garbled},
		{"72 01 : crc=57 YES\n72 01 t=123456789\n", 0, w1Garbled},
		{"7 01 : crc=57 YES\n72 01 t=1\n", 0, w1Garbled},
		{" : crc=57 YES\n t=1\n", 0, w1Garbled},
	} {
		milli, got := parseW1Slave([]byte(tc.text))
		if got != tc.want || milli != tc.milli {
			t.Errorf("parseW1Slave(%q) = %d, %d; want %d, %d", tc.text, milli, got, tc.milli, tc.want)
		}
	}
}

func BenchmarkDS18B20Read(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "28-0316a279f3ff")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "w1_slave"), []byte(w1Texts["23.125"]), 0o644); err != nil {
		b.Fatal(err)
	}
	d, err := openDS18B20(dir, "28-0316a279f3ff")
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	benchmarkRead(b, d)
}
