package sim

import (
	"testing"
	"time"
)

func TestSimSHT3xCRC(t *testing.T) {
	// The datasheet's example (SHT3x-DIS, table 20): 0xBEEF gives 0x92.
	if got := crc8([]byte{0xBE, 0xEF}); got != 0x92 {
		t.Errorf("crc8(BE EF) = 0x%02x, want 0x92", got)
	}
	if got := crc8([]byte{0x00, 0x00}); got != 0x81 {
		t.Errorf("crc8(00 00) = 0x%02x, want 0x81", got)
	}
	if got := sensirionWords(0xBEEF, 0x0000); string(got) != "\xbe\xef\x92\x00\x00\x81" {
		t.Errorf("sensirionWords = % x", got)
	}
}

// shtRead decodes a 6-byte read-out after checking both CRCs.
func shtRead(t *testing.T, r []byte) (temp, hum float64) {
	t.Helper()
	for i := 0; i < 6; i += 3 {
		if got, want := r[i+2], crc8(r[i:i+2]); got != want {
			t.Fatalf("word % x has CRC 0x%02x, want 0x%02x", r[i:i+2], got, want)
		}
	}
	temp = -45 + 175*float64(uint16(r[0])<<8|uint16(r[1]))/65535
	hum = 100 * float64(uint16(r[3])<<8|uint16(r[4])) / 65535
	return temp, hum
}

func TestSimSHT3xMeasurement(t *testing.T) {
	w, clk := newTestWorld(t, 5)
	bus := w.I2C()
	tx := func(wr []byte, n int) ([]byte, error) {
		r := make([]byte, n)
		return r, bus.Tx(AddrSHT3x, wr, r)
	}
	// Nothing to read: the read header is refused, so the chip does not
	// show up to a read probe.
	_, err := tx(nil, 1)
	wantNACK(t, err, "no measurement to read")

	// Status after power-on: alert pending and reset detected, with CRC.
	if _, err := tx([]byte{0xF3, 0x2D}, 0); err != nil {
		t.Fatal(err)
	}
	st, err := tx(nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	if st[0] != 0x80 || st[1] != 0x10 || st[2] != crc8(st[:2]) {
		t.Errorf("status % x, want 80 10 and its CRC", st)
	}
	if _, err := tx([]byte{0x30, 0x41}, 0); err != nil { // clear status
		t.Fatal(err)
	}
	if st, err := tx([]byte{0xF3, 0x2D}, 3); err != nil || st[0] != 0 || st[1] != 0 {
		t.Errorf("status after clearing: % x, %v; want 00 00", st, err)
	}

	for _, tc := range []struct {
		cmd  []byte
		time time.Duration // the datasheet's maximum
	}{
		{[]byte{0x24, 0x00}, 15 * time.Millisecond},
		{[]byte{0x24, 0x0B}, 6 * time.Millisecond},
		{[]byte{0x24, 0x16}, 4 * time.Millisecond},
	} {
		clk.Add(5 * time.Hour)
		want := w.Values()
		start := time.Now()
		if _, err := tx(tc.cmd, 0); err != nil {
			t.Fatal(err)
		}
		_, err := tx(nil, 6)
		if time.Since(start) < tc.time {
			wantNACK(t, err, "measurement in progress")
			_, err = tx([]byte{0xF3, 0x2D}, 0)
			wantNACK(t, err, "measurement in progress")
		}
		time.Sleep(tc.time)
		r, err := tx(nil, 6)
		if err != nil {
			t.Fatalf("command % x: read after %s: %v", tc.cmd, tc.time, err)
		}
		temp, hum := shtRead(t, r)
		// One count is 175/65535 °C and 100/65535 %.
		if !near(temp, want.Temperature, 0.0014) || !near(hum, want.Humidity, 0.0008) {
			t.Errorf("command % x: %.4f °C %.4f %%, want %.4f °C %.4f %%", tc.cmd, temp, hum, want.Temperature, want.Humidity)
		}
		_, err = tx(nil, 6)
		wantNACK(t, err, "no measurement to read")
	}

	// Clock stretching: the read in the same transaction waits.
	start := time.Now()
	r, err := tx([]byte{0x2C, 0x06}, 6)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 15*time.Millisecond {
		t.Errorf("a clock-stretched read returned after %s, before the measurement's 15 ms", el)
	}
	shtRead(t, r)

	// Soft reset: busy for 1.5 ms, then the reset bit is back.
	if _, err := tx([]byte{0x30, 0xA2}, 0); err != nil {
		t.Fatal(err)
	}
	_, err = tx([]byte{0xF3, 0x2D}, 0)
	wantNACK(t, err, "soft reset in progress")
	time.Sleep(2 * time.Millisecond)
	if st, err := tx([]byte{0xF3, 0x2D}, 3); err != nil || st[1]&0x10 == 0 {
		t.Errorf("status after soft reset: % x, %v; want the reset bit", st, err)
	}

	_, err = tx([]byte{0x12, 0x34}, 0)
	wantNACK(t, err, "unknown command 0x1234")
	// An SHT4x command (one byte) is taken and forgotten; there is then
	// nothing to read.
	if _, err := tx([]byte{0xFD}, 0); err != nil {
		t.Errorf("a one-byte write: %v", err)
	}
	_, err = tx(nil, 6)
	wantNACK(t, err, "no measurement to read")
}
