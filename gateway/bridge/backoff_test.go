package bridge

import (
	"math"
	"testing"
	"time"
)

func TestBackoffBounds(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the largest draw
	bottom := func(int64) int64 { return 0 }
	tests := []struct {
		name     string
		b        Backoff
		attempt  int
		low, top time.Duration // Next with the smallest and the largest draw
	}{
		{"first", Backoff{Min: time.Second, Max: time.Minute}, 0, backoffFloor, time.Second},
		{"doubles", Backoff{Min: time.Second, Max: time.Minute}, 3, backoffFloor, 8 * time.Second},
		{"capped", Backoff{Min: time.Second, Max: time.Minute}, 6, backoffFloor, time.Minute},
		{"huge attempt", Backoff{Min: time.Second, Max: time.Minute}, 1 << 30, backoffFloor, time.Minute},
		{"negative attempt", Backoff{Min: time.Second, Max: time.Minute}, -5, backoffFloor, time.Second},
		{"defaults", Backoff{}, 100, backoffFloor, defaultBackoffMax},
		{"zero Min", Backoff{Max: time.Hour}, 0, backoffFloor, defaultBackoffMin},
		{"Max below Min", Backoff{Min: 5 * time.Second, Max: time.Second}, 4, backoffFloor, 5 * time.Second},
		{"Min below floor", Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}, 9, backoffFloor, backoffFloor},
		{"no overflow", Backoff{Min: time.Second, Max: math.MaxInt64}, 200, backoffFloor, math.MaxInt64 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.b
			b.rand = bottom
			if got := b.Next(tt.attempt); got != tt.low {
				t.Errorf("smallest draw: Next(%d) = %v, want %v", tt.attempt, got, tt.low)
			}
			b.rand = top
			if got := b.Next(tt.attempt); got != tt.top {
				t.Errorf("largest draw: Next(%d) = %v, want %v", tt.attempt, got, tt.top)
			}
		})
	}
}

// TestBackoffDistribution draws with the real generator: every delay is
// within the bounds, and the draws spread evenly over them (full jitter),
// not bunched at the ceiling.
func TestBackoffDistribution(t *testing.T) {
	b := Backoff{Min: time.Second, Max: time.Minute}
	const n = 20000
	ceil := 8 * time.Second // attempt 3
	var sum time.Duration
	var quarters [4]int
	for range n {
		d := b.Next(3)
		if d < backoffFloor || d > ceil {
			t.Fatalf("Next(3) = %v, outside [%v, %v]", d, backoffFloor, ceil)
		}
		sum += d
		quarters[min(int(d*4/ceil), 3)]++
	}
	// Uniform on [0, 8s]: mean 4s, a quarter in each quarter. The bounds
	// are more than five standard deviations wide at n = 20000.
	if mean := sum / n; mean < 3800*time.Millisecond || mean > 4200*time.Millisecond {
		t.Errorf("mean delay %v, want about 4s", mean)
	}
	for i, q := range quarters {
		if q < n/4-600 || q > n/4+600 {
			t.Errorf("quarter %d of [0, %v] got %d of %d draws, want about %d", i, ceil, q, n, n/4)
		}
	}
}
