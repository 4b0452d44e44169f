package ops

import (
	"net/http"
	"sync/atomic"
)

// The status page names connected clients, their users and addresses.
// On loopback only the gateway's own users reach it, and it is open as
// before; on any other address it asks for the same login as the switch
// (the ops token, or an MQTT user's), and with neither configured it is
// refused. /healthz, /readyz and /metrics stay open: probes and scrapers
// need them, and they hold counters, not who is connected.

// How the status page is served, by listener and configuration.
const (
	pageOpen    = "open"    // loopback listener
	pageLogin   = "login"   // asks for the token or an MQTT user's login
	pageRefused = "refused" // not loopback, and nothing to log in with
)

// noPageLoginHint tells an operator what to configure to see the page.
const noPageLoginHint = "the status page shows connected clients, their users and addresses, so on an ops.address that is not loopback it needs a login; " +
	"set ops.token, or broker.password_file to log in as an MQTT user, or bind ops.address to 127.0.0.1"

// refusedCounts count the requests refused for who made them.
type refusedCounts struct {
	login atomic.Int64 // wrong credentials, for the page or the switch
	acl   atomic.Int64 // a switch the ACL does not give the user
}

func (s *Server) pageMode() string {
	switch {
	case s.loopback:
		return pageOpen
	case s.src.Token != "" || s.src.CheckPassword != nil:
		return pageLogin
	}
	return pageRefused
}

// loginForPage serves next to those who logged in, when the page needs a
// login.
func (s *Server) loginForPage(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch s.pageMode() {
		case pageOpen:
			next.ServeHTTP(w, r)
			return
		case pageRefused:
			plain(w, http.StatusForbidden, noPageLoginHint+"\n")
			return
		}
		if _, _, ok, given := s.credentials(r); !ok {
			if given {
				s.refused.login.Add(1)
				s.log.Warn("refused the status page with wrong credentials", "remote", r.RemoteAddr)
			}
			s.askLogin(w, "the status page needs ")
			return
		}
		next.ServeHTTP(w, r)
	})
}
