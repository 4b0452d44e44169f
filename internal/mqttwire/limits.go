package mqttwire

import "time"

// The protocol's numeric limits: the largest value each field can carry.
// The framing checks against them, and so do the configuration checks and
// client options that bound a value by what MQTT can put on the wire.
const (
	// MaxVarint is the largest Variable Byte Integer, four bytes of seven bits (MQTT 5 §1.5.5, 3.1.1 §2.2.3).
	MaxVarint = 268_435_455
	// MaxRemaining is the largest Remaining Length, a Variable Byte Integer (MQTT 5 §2.1.4, 3.1.1 §2.2.3).
	MaxRemaining = MaxVarint
	// MaxPacket is the largest packet in bytes: one header byte, four length bytes and MaxRemaining (MQTT 5 §2.1.4).
	MaxPacket = 1 + 4 + MaxRemaining
	// MaxTwoByte is the largest Two Byte Integer, such as Receive Maximum or Topic Alias Maximum (MQTT 5 §1.5.2, 3.1.1 §1.5.2).
	MaxTwoByte = 65535
	// MaxPacketID is the largest Packet Identifier, a non-zero Two Byte Integer, so also how many there are (MQTT 5 §2.2.1, 3.1.1 §2.3.1).
	MaxPacketID = MaxTwoByte
	// MaxString is the longest UTF-8 Encoded String or Binary Data, in bytes, after its two-byte length (MQTT 5 §1.5.4 and §1.5.6, 3.1.1 §1.5.3).
	MaxString = MaxTwoByte
	// MaxKeepAlive is the longest Keep Alive, a Two Byte Integer count of seconds (MQTT 5 and 3.1.1 §3.1.2.10).
	MaxKeepAlive = MaxTwoByte * time.Second
	// MaxSessionExpiry is the longest Session Expiry Interval, a Four Byte Integer count of seconds that means "never expires" (MQTT 5 §3.1.2.11.2).
	MaxSessionExpiry = 4_294_967_295 * time.Second
	// MaxSubscriptionID is the largest Subscription Identifier, a Variable Byte Integer from 1 (MQTT 5 §3.8.2.1.2).
	MaxSubscriptionID = MaxVarint
)
