package mqttwire

import (
	"testing"
	"time"
)

// TestLimits checks each limit against the field it bounds: the largest
// value fits the field's encoding and one more does not.
func TestLimits(t *testing.T) {
	if n := len(AppendVarint(nil, MaxVarint)); n != 4 {
		t.Errorf("MaxVarint takes %d bytes, want 4", n)
	}
	if n := len(AppendVarint(nil, MaxVarint+1)); n != 5 {
		t.Errorf("MaxVarint+1 takes %d bytes, want 5", n)
	}
	if v, size, ok := Varint([]byte{0xFF, 0xFF, 0xFF, 0x7F}); !ok || size != 4 || v != MaxRemaining {
		t.Errorf("the largest four-byte length decodes to %d (%d bytes, %v), want MaxRemaining %d", v, size, ok, MaxRemaining)
	}
	if MaxPacket != 268_435_460 {
		t.Errorf("MaxPacket = %d, want 268435460", MaxPacket)
	}
	if MaxTwoByte != 1<<16-1 || MaxString != MaxTwoByte || MaxPacketID != MaxTwoByte {
		t.Errorf("two-byte limits %d, %d, %d; want 65535", MaxTwoByte, MaxString, MaxPacketID)
	}
	if MaxKeepAlive != 65535*time.Second || MaxKeepAlive.String() != "18h12m15s" {
		t.Errorf("MaxKeepAlive = %s, want 18h12m15s", MaxKeepAlive)
	}
	if MaxSessionExpiry != (1<<32-1)*time.Second {
		t.Errorf("MaxSessionExpiry = %s, want 4294967295s", MaxSessionExpiry)
	}
	if MaxSubscriptionID != MaxVarint {
		t.Errorf("MaxSubscriptionID = %d, want %d", MaxSubscriptionID, MaxVarint)
	}
}
