package systemd

import (
	"fmt"
	"net"

	"github.com/coreos/go-systemd/v22/activation"
)

// Listeners returns the sockets systemd passed (LISTEN_FDS, LISTEN_PID,
// LISTEN_FDNAMES), by FileDescriptorName, and unsets the variables so
// that no child process takes them for its own. Without socket activation
// the map is empty. On an error nothing stays open.
//
// Each name must be unique: a .socket unit gives all of its sockets the
// same FileDescriptorName, so two ListenStream= lines for one listener
// belong in two units with their own names (one ListenStream=1883 already
// covers IPv4 and IPv6).
func Listeners() (map[string]net.Listener, error) {
	ls := make(map[string]net.Listener)
	fail := func(err error) (map[string]net.Listener, error) {
		for _, l := range ls {
			l.Close()
		}
		return nil, err
	}
	files := activation.Files(true)
	defer func() {
		// net.FileListener works on a duplicate; the originals go.
		for _, f := range files {
			f.Close()
		}
	}()
	for i, f := range files {
		name := f.Name()
		if _, dup := ls[name]; dup {
			return fail(fmt.Errorf("systemd: socket activation: two sockets named %q; give each its own FileDescriptorName", name))
		}
		l, err := net.FileListener(f)
		if err != nil {
			return fail(fmt.Errorf("systemd: socket activation: fd %d (%s) is not a listening stream socket: %w", 3+i, name, err))
		}
		ls[name] = l
	}
	return ls, nil
}
