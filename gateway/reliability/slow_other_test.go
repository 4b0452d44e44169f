//go:build !linux

package reliability

import (
	"errors"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// slowStamped needs SO_TIMESTAMPNS, which only Linux offers here; without
// it the subscribers' latency is not split.
type slowStamped struct{}

func slowNewStamped(*client) (*slowStamped, error) { return nil, errors.ErrUnsupported }

func (*slowStamped) read() (*packets.Packet, time.Time, error) {
	return nil, time.Time{}, errors.ErrUnsupported
}
