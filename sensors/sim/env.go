package sim

import (
	"math"
	"time"
)

// Values is the simulated environment at one moment: what the chips
// measure.
type Values struct {
	Time        time.Time
	Temperature float64    // air, °C: 21 ± 4 over the day (warmest at 15:00 UTC) plus a slow drift
	Humidity    float64    // relative, %: 35 to 70, falling as the air warms
	Pressure    float64    // barometric, hPa: about 1013, drifting over days
	Tank        float64    // the tank's water pressure, bar: 2 to 6
	Battery     float64    // the battery, V: 12.0 to 13.8, charging by day
	Load        float64    // current drawn from the battery through the INA219's shunt, A: about 0.5
	Inputs      [4]float64 // the ADS1115's inputs A0..A3 against ground, V
}

// Wiring of the simulated installation.
const (
	// TransmitterShunt turns the tank's 4–20 mA transmitter into 0.4–2.0 V at A0.
	TransmitterShunt = 100.0 // Ω
	// TankFullScale is the pressure at which the transmitter gives 20 mA.
	TankFullScale = 10.0 // bar
	// BatteryDivider is the ratio of the divider from the battery to A1.
	BatteryDivider = 4.0
	// LoadShunt is the INA219's shunt resistor.
	LoadShunt = 0.1 // Ω
)

// Streams of the drift noise, one per quantity, so that each drifts on its
// own.
const (
	streamTempSlow = iota + 1
	streamTempFast
	streamHumidity
	streamPressureSlow
	streamPressureFast
	streamTankSlow
	streamTankFast
	streamBattery
	streamLoadSlow
	streamLoadFast
	streamA2
	streamA3
)

// ValuesAt returns what the chips measure at t. It is a function of the
// seed and t alone: the drifts are smooth noise keyed by the seed, not a
// walk that depends on how often it was asked.
func (w *World) ValuesAt(t time.Time) Values {
	t = t.UTC()
	day := float64(t.Hour()) + float64(t.Minute())/60 + float64(t.Second())/3600
	n := func(stream uint64, period time.Duration) float64 { return w.drift(stream, t, period) }

	v := Values{Time: t}
	v.Temperature = 21 + 4*math.Cos(2*math.Pi*(day-15)/24) +
		1.5*n(streamTempSlow, 6*time.Hour) + 0.3*n(streamTempFast, 40*time.Minute)
	v.Humidity = clamp(52-2.5*(v.Temperature-21)+4*n(streamHumidity, 3*time.Hour), 35, 70)
	v.Pressure = 1013 + 10*n(streamPressureSlow, 48*time.Hour) + 1.5*n(streamPressureFast, 3*time.Hour)
	v.Tank = clamp(4+1.7*n(streamTankSlow, 20*time.Minute)+0.3*n(streamTankFast, time.Minute), 2, 6)
	// The solar charger lifts the battery by day, most at 13:00.
	v.Battery = clamp(12.9+0.6*math.Cos(2*math.Pi*(day-13)/24)+0.25*n(streamBattery, 4*time.Hour), 12.0, 13.8)
	v.Load = 0.5 + 0.04*n(streamLoadSlow, 5*time.Minute) + 0.01*n(streamLoadFast, 10*time.Second)

	current := 0.004 + 0.016*v.Tank/TankFullScale // A
	v.Inputs[0] = current * TransmitterShunt
	v.Inputs[1] = v.Battery / BatteryDivider
	// Unused inputs tied to ground still read a few tens of µV.
	v.Inputs[2] = 50e-6 * n(streamA2, time.Second)
	v.Inputs[3] = 50e-6 * n(streamA3, time.Second)
	return v
}

// drift is smooth noise in [-1, 1]: random values keyed by the seed at
// every multiple of period, eased into each other. It stands in for a
// random walk that stays in bounds.
func (w *World) drift(stream uint64, t time.Time, period time.Duration) float64 {
	x := float64(t.UnixNano()) / float64(period)
	k := math.Floor(x)
	f := x - k
	f = f * f * (3 - 2*f) // smoothstep: no kink at the knots
	a := w.knot(stream, int64(k))
	b := w.knot(stream, int64(k)+1)
	return a + (b-a)*f
}

// knot is the noise value in [-1, 1] at knot k of stream.
func (w *World) knot(stream uint64, k int64) float64 {
	h := mix(w.seed ^ mix(stream) ^ mix(uint64(k)+0x632be59bd9b4e019))
	return float64(h>>11)/float64(1<<52) - 1
}

// mix is the SplitMix64 finaliser: a cheap hash whose output bits all
// depend on every input bit.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func clamp(v, lo, hi float64) float64 { return min(max(v, lo), hi) }
