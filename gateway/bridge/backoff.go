package bridge

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff spaces reconnection attempts: the ceiling doubles from Min with
// every failed attempt up to Max, and each delay is drawn uniformly from
// zero to that ceiling ("full jitter"). Jitter over the whole range, rather
// than a little around the ceiling, is what keeps a fleet of gateways cut
// off by one outage from coming back in lockstep and knocking the broker
// over again. The caller keeps the attempt count: 0 for the first retry,
// and back to 0 once a connection has held.
type Backoff struct {
	Min, Max time.Duration
	rand     func(int64) int64 // uniform in [0, n); nil: math/rand/v2
}

// Defaults for a zero Min or Max.
const (
	defaultBackoffMin = time.Second
	defaultBackoffMax = 2 * time.Minute
)

// backoffFloor is the shortest delay Next returns. Full jitter can draw
// zero, and a gateway whose server accepts and at once drops it would then
// reconnect in a tight loop; 100 ms caps that at ten attempts a second.
const backoffFloor = 100 * time.Millisecond

// Next returns the delay before retry number attempt (from 0): uniform in
// [0, min(Max, Min·2^attempt)], but never below backoffFloor. A zero Min is
// one second, a zero Max two minutes, and a Max below Min is Min.
func (b Backoff) Next(attempt int) time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = defaultBackoffMin
	}
	if hi <= 0 {
		hi = defaultBackoffMax
	}
	hi = max(hi, lo)
	ceil := lo
	for range max(attempt, 0) {
		if ceil > hi/2 {
			// Doubling would pass Max, or overflow on a huge one.
			ceil = hi
			break
		}
		ceil *= 2
	}
	draw := b.rand
	if draw == nil {
		draw = rand.Int64N
	}
	n := int64(ceil)
	if n < math.MaxInt64 {
		n++ // the ceiling itself is a possible delay
	}
	return max(time.Duration(draw(n)), backoffFloor)
}
