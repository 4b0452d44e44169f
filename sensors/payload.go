package sensors

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// tsLayout is RFC 3339 in UTC with milliseconds: fixed width, so that
// payloads sort and diff well and the timestamp never reads as a number.
const tsLayout = "2006-01-02T15:04:05.000Z07:00"

// payloadFormat holds the fixed parts of one quantity's reading payload,
//
//	{"value":21.53,"unit":"°C","ts":"2026-11-29T20:40:00.123Z"}
//
// so that a reading is appended into a reused buffer without allocating.
type payloadFormat struct {
	decimals int
	middle   []byte // ,"unit":"°C","ts":"
}

func newPayloadFormat(q Quantity) payloadFormat {
	unit, _ := json.Marshal(q.Unit) // a string always marshals
	m := append([]byte(`,"unit":`), unit...)
	m = append(m, `,"ts":"`...)
	return payloadFormat{decimals: q.Decimals, middle: m}
}

// appendReading appends the payload for value v taken at t.
func (f *payloadFormat) appendReading(b []byte, v float64, t time.Time) []byte {
	b = append(b, `{"value":`...)
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		// Callers drop NaN and ±Inf; 0 avoids printing -0.
		b = append(b, '0')
	} else {
		b = strconv.AppendFloat(b, v, 'f', f.decimals, 64)
		if f.decimals > 0 && isNegativeZero(b) {
			b = b[:len(b)-f.decimals-3]
			b = strconv.AppendFloat(b, 0, 'f', f.decimals, 64)
		}
	}
	b = append(b, f.middle...)
	b = t.UTC().AppendFormat(b, tsLayout)
	return append(b, `"}`...)
}

// isNegativeZero reports whether b ends in a value that rounded to -0.00.
func isNegativeZero(b []byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		switch c := b[i]; {
		case c == '-':
			return true
		case c == '0' || c == '.':
		default:
			return false
		}
	}
	return false
}
