package ops

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
)

// How a switch request is authorised, by what is configured:
//
//   - ops.token set: the token as the form field "token" or in an
//     "Authorization: Bearer" header;
//   - an MQTT password file: HTTP basic auth as any user in it;
//   - neither: no credentials, but only on a loopback listener, and only
//     for requests that name a loopback host (which turns away a DNS name
//     an attacker points at 127.0.0.1); elsewhere switching is refused
//     with 403 until one of the two is configured.
//
// Cross-site requests are refused before any of this (see handler).
const (
	modeOff      = "off"      // no SetOutput: the gateway has no switch
	modeRefused  = "refused"  // no credentials configured on a non-loopback listener
	modeLoopback = "loopback" // no credentials, loopback listener
	modeAuth     = "auth"     // token and/or password file
)

// noAuthHint tells an operator what to configure to allow switching.
const noAuthHint = "switching outputs is off: no credentials are configured and ops.address is not a loopback address; " +
	"set ops.token, or broker.password_file to log in as an MQTT user, or bind ops.address to 127.0.0.1"

func (s *Server) switchMode() string {
	switch {
	case s.src.SetOutput == nil:
		return modeOff
	case s.src.Token != "" || s.src.CheckPassword != nil:
		return modeAuth
	case s.loopback:
		return modeLoopback
	}
	return modeRefused
}

func (s *Server) switchView() switchView {
	switch s.switchMode() {
	case modeOff:
		return switchView{Note: "This gateway offers no output switch."}
	case modeRefused:
		return switchView{Note: noAuthHint + "."}
	case modeLoopback:
		return switchView{Enabled: true, Note: "Switching needs no login: this page is served on loopback only."}
	}
	v := switchView{Enabled: true, TokenField: s.src.Token != ""}
	switch {
	case s.src.Token != "" && s.src.CheckPassword != nil:
		v.Note = "Switching needs the ops token, or an MQTT user's login (leave the token empty to be asked)."
	case s.src.Token != "":
		v.Note = "Switching needs the ops token."
	default:
		v.Note = "Switching asks for an MQTT user's login."
	}
	return v
}

// switchOutput serves POST /outputs/{name} with the form field state=on
// or state=off.
func (s *Server) switchOutput(w http.ResponseWriter, r *http.Request) {
	if s.src.SetOutput == nil {
		plain(w, http.StatusNotImplemented, "this gateway offers no output switch\n")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		plain(w, http.StatusBadRequest, "cannot read the form: "+err.Error()+"\n")
		return
	}
	who, ok := s.authorise(w, r)
	if !ok {
		return
	}
	name := r.PathValue("name")
	var on bool
	switch r.PostForm.Get("state") {
	case "on":
		on = true
	case "off":
	default:
		plain(w, http.StatusBadRequest, "the form field state must be on or off\n")
		return
	}
	if !slices.ContainsFunc(call(s.src.Outputs), func(o Output) bool { return o.Name == name }) {
		plain(w, http.StatusNotFound, fmt.Sprintf("no output is named %q\n", name))
		return
	}
	if err := s.src.SetOutput(name, on); err != nil {
		s.log.Error("switching an output from the ops endpoint failed", "output", name, "on", on, "by", who, "err", err)
		plain(w, http.StatusInternalServerError, fmt.Sprintf("switching %s failed: %v\n", name, err))
		return
	}
	s.log.Info("output switched from the ops endpoint", "output", name, "on", on, "by", who, "remote", r.RemoteAddr)
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		// Post/Redirect/Get: reloading the page does not switch again.
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	state := "off"
	if on {
		state = "on"
	}
	plain(w, http.StatusOK, name+" "+state+"\n")
}

// authorise checks a switch request's credentials and names who made it;
// when it returns false it has written the refusal.
func (s *Server) authorise(w http.ResponseWriter, r *http.Request) (string, bool) {
	switch s.switchMode() {
	case modeRefused:
		plain(w, http.StatusForbidden, noAuthHint+"\n")
		return "", false
	case modeLoopback:
		if !loopbackHost(r.Host) {
			plain(w, http.StatusForbidden, fmt.Sprintf("switching without credentials is allowed only at a loopback host such as 127.0.0.1 or localhost, not %q; or set ops.token\n", r.Host))
			return "", false
		}
		return "loopback", true
	}
	given := false
	if tok := s.src.Token; tok != "" {
		cand, found := bearer(r)
		if !found {
			cand, found = r.PostForm.Get("token"), r.PostForm.Get("token") != ""
		}
		if found {
			given = true
			if equalSecret(cand, tok) {
				return "token", true
			}
		}
	}
	if s.src.CheckPassword != nil {
		if user, pass, found := r.BasicAuth(); found {
			given = true
			if s.checkPassword(r, user, pass) {
				return user, true
			}
		}
	}
	if given {
		s.log.Warn("refused an output switch with wrong credentials", "remote", r.RemoteAddr, "output", r.PathValue("name"))
	}
	if s.src.CheckPassword != nil {
		w.Header().Set("WWW-Authenticate", `Basic realm="fieldgate outputs", charset="UTF-8"`)
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fieldgate outputs"`)
	}
	var how []string
	if s.src.Token != "" {
		how = append(how, "the ops token (form field token, or Authorization: Bearer)")
	}
	if s.src.CheckPassword != nil {
		how = append(how, "an MQTT user's login (HTTP basic auth)")
	}
	plain(w, http.StatusUnauthorized, "switching outputs needs "+strings.Join(how, " or ")+"\n")
	return "", false
}

// checkPassword runs CheckPassword with at most cap(s.auth) checks at a
// time: each is a bcrypt hash, a fraction of a second of a Pi's core.
func (s *Server) checkPassword(r *http.Request, user, pass string) bool {
	select {
	case s.auth <- struct{}{}:
	case <-r.Context().Done():
		return false
	}
	defer func() { <-s.auth }()
	return s.src.CheckPassword(user, pass)
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// equalSecret compares in time that depends on neither input: hashing
// first hides the length as well as the content.
func equalSecret(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// loopbackHost reports whether a request's Host names this machine by a
// loopback address or as localhost.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
