package sensors

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2ctest"
	"periph.io/x/conn/v3/physic"
)

// faultBus is an I²C bus for failure cases: transaction number at (counting
// from 0) fails with err without reaching the underlying playback, which
// holds the traffic recorded around it.
type faultBus struct {
	i2c.Bus
	at  map[int]error
	n   int
	log []string
}

func (f *faultBus) Tx(addr uint16, w, r []byte) error {
	n := f.n
	f.n++
	f.log = append(f.log, fmt.Sprintf("#%d addr=0x%02x w=% x r=%d", n, addr, w, len(r)))
	if err, ok := f.at[n]; ok {
		return err
	}
	return f.Bus.Tx(addr, w, r)
}

func (f *faultBus) SetSpeed(physic.Frequency) error { return nil }

// errLinuxNack is the error periph's sysfs bus returns for a device that does
// not acknowledge: the ioctl's errno, as text only.
var errLinuxNack = errors.New("sysfs-i2c: " + syscall.EREMOTEIO.Error())

func TestNackBusClassifiesAdapterErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		nack bool
	}{
		{errLinuxNack, true},
		{errors.New("sysfs-i2c: " + syscall.ENXIO.Error()), true},
		{fmt.Errorf("wrapped: %w", syscall.EREMOTEIO), true},
		{errors.New("sysfs-i2c: invalid address"), false},
	} {
		pb := &i2ctest.Playback{DontPanic: true}
		bus := nackBus{&faultBus{Bus: pb, at: map[int]error{0: tc.err}}}
		err := bus.Tx(0x76, []byte{0xd0}, make([]byte, 1))
		if got := errors.Is(err, ErrNoAck); got != tc.nack {
			t.Errorf("%v: errors.Is(ErrNoAck) = %v, want %v", tc.err, got, tc.nack)
		}
		if Reason(err) == ReasonNoAck != tc.nack {
			t.Errorf("%v: Reason = %s", tc.err, Reason(err))
		}
	}
}

func TestI2CBusNames(t *testing.T) {
	for in, want := range map[string]int{"1": 1, "i2c1": 1, "i2c-1": 1, "/dev/i2c-11": 11, "I2C0": 0} {
		if got, err := i2cBusNumber(in); err != nil || got != want {
			t.Errorf("i2cBusNumber(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "i2c", "x1", "/dev/i2c-300", "-1"} {
		if _, err := i2cBusNumber(in); err == nil {
			t.Errorf("i2cBusNumber(%q) accepted", in)
		}
	}
}
