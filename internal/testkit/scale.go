package testkit

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// ScaleEnv names the environment variable that multiplies every test
// deadline, on top of the race detector's factor: a number of at least 1,
// such as 3 on a machine that other work loads.
const ScaleEnv = "FIELDGATE_TEST_TIMESCALE"

// pollEvery is how often WaitFor looks at its condition once it has
// waited a while: short next to any deadline, long enough that the
// polling itself costs nothing a loaded machine would notice. It starts at
// a millisecond, so that a condition about to hold costs no more.
const pollEvery = 10 * time.Millisecond

// factor is the product of raceFactor and ScaleEnv, read once. A value
// that does not parse panics: a typo must not leave the suite on its
// short deadlines unnoticed, and no test has run yet that could fail.
var factor = sync.OnceValue(func() float64 {
	f, err := scaleOf(os.Getenv(ScaleEnv), raceFactor)
	if err != nil {
		panic(err)
	}
	return f
})

// scaleOf is the factor for the value env of ScaleEnv (empty: unset) on a
// build whose race factor is race.
func scaleOf(env string, race float64) (float64, error) {
	if env == "" {
		return race, nil
	}
	v, err := strconv.ParseFloat(env, 64)
	if err != nil || !(v >= 1) || math.IsInf(v, 0) { // !(v >= 1): NaN too
		return 0, fmt.Errorf("testkit: %s=%q: want a number of at least 1", ScaleEnv, env)
	}
	return race * v, nil
}

// Factor returns the number Scale multiplies by: raceFactor under the race
// detector, 1 otherwise, times FIELDGATE_TEST_TIMESCALE when it is set.
func Factor() float64 { return factor() }

// Scale returns the deadline d stretched by the suite's time scale. Use it
// for how long a test waits for what should happen, never for a duration
// the test measures or sets on the code under test.
func Scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) * factor())
}

// WaitFor polls cond until it holds and fails the test, naming what, if it
// has not within Scale(within).
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	limit := Scale(within)
	deadline := time.Now().Add(limit)
	for sleep := time.Millisecond; !cond(); sleep = min(2*sleep, pollEvery) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(sleep)
	}
}
