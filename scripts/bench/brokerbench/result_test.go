package brokerbench

import "testing"

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v     float64
		value string
	}{
		{v: 0, value: "0"},
		{v: 0.01234, value: "0.0123"},
		{v: 3.14159, value: "3.14"},
		{v: 42.42, value: "42.42"},
		{v: 123.456, value: "123.5"},
		{v: 1234567.8, value: "1234568"},
		{v: -18928, value: "-18928"},
	} {
		if got := formatValue(tc.v); got != tc.value {
			t.Errorf("formatValue(%v) = %q, want %q", tc.v, got, tc.value)
		}
	}
}
