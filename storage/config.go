package storage

import (
	"strings"

	"github.com/fieldgate/fieldgate/internal/check"
)

// Config is the storage: section of the configuration file: where the
// state database is, and how much the queues of persistent sessions may
// hold in it all together.
type Config struct {
	Path string `yaml:"path"` // the bbolt file holding sessions, retained messages and the outbox
	// MaxQueuedBytes bounds the QoS 1/2 messages held for all persistent
	// sessions together; broker.max_queued_bytes bounds each one.
	MaxQueuedBytes int `yaml:"max_queued_bytes"`
	// QueuePolicy is what happens to a session whose queue is full:
	// drop_oldest makes room by dropping its oldest QoS 1 message;
	// refuse turns the new message away (an MQTT 5 publisher gets 0x97).
	QueuePolicy string `yaml:"queue_policy"`
}

// Queue policies for full session queues.
const (
	QueueDropOldest = "drop_oldest"
	QueueRefuse     = "refuse"
)

// DefaultConfig returns the storage section a file leaves out.
func DefaultConfig() Config {
	return Config{
		Path: "/var/lib/fieldgate/state.db",
		// 64 MiB of queued messages is a day of a busy site's
		// telemetry for a dashboard that is away, and a small share
		// of a 512 MB board even if it all comes back into memory.
		MaxQueuedBytes: 64 << 20,
		// Dropping the oldest keeps the newest readings, which is what
		// a telemetry consumer returning after an outage wants.
		QueuePolicy: QueueDropOldest,
	}
}

// Check reports the section's problems to k, under the key storage. The
// queue budget is checked against one session's by the broker, which
// applies both.
func (c Config) Check(k *check.Checker) {
	switch p := c.Path; {
	case p == "":
		k.Fail("storage.path", "required: the state database file, such as /var/lib/fieldgate/state.db")
	case strings.HasSuffix(p, "/"):
		k.Fail("storage.path", "%q names a directory; name the file, such as %sstate.db", p, p)
	}
	k.OneOf("storage.queue_policy", c.QueuePolicy, QueueDropOldest, QueueRefuse)
}
