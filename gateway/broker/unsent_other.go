//go:build !linux

package broker

import "net"

// limitUnsent does nothing where TCP_NOTSENT_LOWAT is not available; the
// gateway's targets are Linux.
func limitUnsent(*net.TCPConn) {}
