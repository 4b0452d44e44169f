package mqttwire

// Varint decodes the MQTT variable byte integer (MQTT 5 §1.5.5, 3.1.1
// §2.2.3) at the start of b and the bytes it takes. ok is false when b
// ends inside it or it runs past four bytes [MQTT-1.5.5-1].
func Varint(b []byte) (n, size int, ok bool) {
	mult := 1
	for i := 0; i < 4 && i < len(b); i++ {
		n += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return n, i + 1, true
		}
		mult *= 128
	}
	return 0, 0, false
}

// AppendVarint appends n, at most MaxRemaining, as an MQTT variable byte
// integer in the fewest bytes.
func AppendVarint(dst []byte, n int) []byte {
	for {
		b := byte(n & 0x7f)
		n >>= 7
		if n > 0 {
			b |= 0x80
		}
		dst = append(dst, b)
		if n == 0 {
			return dst
		}
	}
}

// varintLen is how many bytes AppendVarint takes for n.
func varintLen(n int) int {
	size := 1
	for n > 0x7f {
		n >>= 7
		size++
	}
	return size
}
