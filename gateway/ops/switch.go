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
//   - ops.token set: the token as the form field "token", in an
//     "Authorization: Bearer" header, or as the password of HTTP basic
//     auth (any user name), which is how a browser sends it;
//   - an MQTT password file: HTTP basic auth as a user in it whose MQTT
//     clients the broker's ACL lets publish to the output's set topic
//     (Sources.MaySwitch);
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
	who, user, ok := s.authorise(w, r)
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
	// An MQTT user switches only what its MQTT clients may switch: the
	// same publish permission on the output's set topic, from the ACL the
	// broker runs now.
	if user != "" && s.src.MaySwitch != nil && !s.src.MaySwitch(user, name) {
		s.refused.acl.Add(1)
		s.log.Warn("refused an output switch: the ACL does not let the user publish to the output's set topic",
			"output", name, "user", user, "remote", r.RemoteAddr)
		plain(w, http.StatusForbidden, fmt.Sprintf("user %q may not switch %s: broker.acl does not let this user publish to its set topic\n", user, name))
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

// authorise checks a switch request's credentials and names who made it,
// and the MQTT user when that is who logged in; when it returns false it
// has written the refusal.
func (s *Server) authorise(w http.ResponseWriter, r *http.Request) (who, user string, ok bool) {
	switch s.switchMode() {
	case modeRefused:
		plain(w, http.StatusForbidden, noAuthHint+"\n")
		return "", "", false
	case modeLoopback:
		if !loopbackHost(r.Host) {
			plain(w, http.StatusForbidden, fmt.Sprintf("switching without credentials is allowed only at a loopback host such as 127.0.0.1 or localhost, not %q; or set ops.token\n", r.Host))
			return "", "", false
		}
		return "loopback", "", true
	}
	who, user, ok, given := s.credentials(r)
	if ok {
		return who, user, true
	}
	if given {
		s.refused.login.Add(1)
		s.log.Warn("refused an output switch with wrong credentials", "remote", r.RemoteAddr, "output", r.PathValue("name"))
	}
	s.askLogin(w, "switching outputs needs ")
	return "", "", false
}

// credentials checks the credentials a request carries: the ops token (in
// an "Authorization: Bearer" header, the form field token, or as the
// password of HTTP basic auth), or an MQTT user's login (HTTP basic
// auth). who names the login for the log, user is the MQTT user (empty
// for the token), given reports whether any credentials came.
func (s *Server) credentials(r *http.Request) (who, user string, ok, given bool) {
	basicUser, basicPass, basic := r.BasicAuth()
	if tok := s.src.Token; tok != "" {
		cand, found := bearer(r)
		if !found {
			cand, found = r.PostForm.Get("token"), r.PostForm.Get("token") != ""
		}
		if !found && basic {
			cand, found = basicPass, true
		}
		if found {
			given = true
			if equalSecret(cand, tok) {
				return "token", "", true, true
			}
		}
	}
	if s.src.CheckPassword != nil && basic {
		given = true
		if s.checkPassword(r, basicUser, basicPass) {
			return basicUser, basicUser, true, true
		}
	}
	return "", "", false, given || basic
}

// askLogin answers 401 with the ways to log in that are configured, after
// what, such as "switching outputs needs ".
func (s *Server) askLogin(w http.ResponseWriter, what string) {
	// Basic is offered whenever a token or a password file is: a browser
	// asks for a login only then, and takes the token as the password.
	w.Header().Set("WWW-Authenticate", `Basic realm="fieldgate", charset="UTF-8"`)
	if s.src.Token != "" && s.src.CheckPassword == nil {
		w.Header().Add("WWW-Authenticate", `Bearer realm="fieldgate"`)
	}
	var how []string
	if s.src.Token != "" {
		how = append(how, "the ops token (Authorization: Bearer, the form field token, or as the password of HTTP basic auth)")
	}
	if s.src.CheckPassword != nil {
		how = append(how, "an MQTT user's login (HTTP basic auth)")
	}
	plain(w, http.StatusUnauthorized, what+strings.Join(how, " or ")+"\n")
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
	return s.src.CheckPassword(r.RemoteAddr, user, pass)
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
