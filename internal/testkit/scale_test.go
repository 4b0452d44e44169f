package testkit

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestScaleOf(t *testing.T) {
	for _, tc := range []struct {
		env  string
		race float64
		want float64
		bad  bool
	}{
		{"", 1, 1, false},
		{"", 3, 3, false},
		{"1", 1, 1, false},
		{"3", 1, 3, false},
		{"2.5", 3, 7.5, false},
		{"0.5", 1, 0, true},
		{"0", 1, 0, true},
		{"-2", 1, 0, true},
		{"three", 1, 0, true},
		{"NaN", 1, 0, true},
		{"Inf", 1, 0, true},
	} {
		got, err := scaleOf(tc.env, tc.race)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), ScaleEnv) {
				t.Errorf("scaleOf(%q, %v) = %v, %v; want an error naming %s", tc.env, tc.race, got, err, ScaleEnv)
			}
			continue
		}
		if err != nil || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("scaleOf(%q, %v) = %v, %v; want %v", tc.env, tc.race, got, err, tc.want)
		}
	}
}

func TestScale(t *testing.T) {
	if Factor() < raceFactor {
		t.Fatalf("Factor() = %v, below the race factor %v", Factor(), float64(raceFactor))
	}
	if got, want := Scale(2*time.Second), time.Duration(float64(2*time.Second)*Factor()); got != want {
		t.Fatalf("Scale(2s) = %v, want %v", got, want)
	}
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, time.Second, "the third look", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("WaitFor returned after %d looks, want 3", n)
	}
}

func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := len(b.String()); got != 400 {
		t.Fatalf("%d bytes written, want 400", got)
	}
}
