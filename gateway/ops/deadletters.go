package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A bridge's dead letters are the messages its upstream kept refusing,
// kept aside in the state file (see package bridge). The endpoint lists
// them and retries or drops them for the operator, who is usually far
// from the board and has a running gateway that holds the state file:
//
//	GET  /bridges/{name}/dead-letters[?limit=N]   JSON, the newest N, oldest first
//	POST /bridges/{name}/dead-letters/retry       seq=… (repeated or comma-separated), or all=true
//	POST /bridges/{name}/dead-letters/drop        the same
//
// Dead letters hold every device's messages, payloads included, so all
// three are the operator's: the ops token, or, with no credentials
// configured, a request to a loopback listener at a loopback host (as
// the output switch); an MQTT user's login is refused, since the ACL
// gives users topics, not the bridge's whole uplink, so that with a
// password file the operator sets ops.token. The POSTs pass the
// same cross-origin check as the switch. fieldgate db deadletters uses
// them when a running gateway holds the file.

// DeadLetter is one dead letter as the endpoint shows it; the fields
// mirror storage.DeadLetter.
type DeadLetter struct {
	Seq      uint64    `json:"seq"`      // its number among the bridge's dead letters
	Topic    string    `json:"topic"`    // the remote topic
	Reason   string    `json:"reason"`   // what the upstream said
	At       time.Time `json:"at"`       // when it was moved
	Failures int       `json:"failures"` // the failures in a row that moved it; 0 when not counted
	QoS      byte      `json:"qos"`
	Retain   bool      `json:"retain"`
	Queued   time.Time `json:"queued"`  // when it was first queued
	Payload  []byte    `json:"payload"` // base64 in JSON
}

// ErrNotFound is what the Sources' dead-letter functions wrap for a
// bridge or a dead letter that does not exist; the endpoint answers 404.
var ErrNotFound = errors.New("not found")

// maxSeqFormBytes bounds a retry or drop request's body: room for a few
// thousand sequence numbers, far more than a person names at once.
const maxSeqFormBytes = 64 << 10

// statusDeadLetters is how many of a bridge's newest dead letters the
// status page shows: enough to see what is refused and why, few enough
// for a phone.
const statusDeadLetters = 3

// deadLetterMode says who may use the dead-letter endpoints: the token
// holder when one is set; with no credentials configured at all, anyone
// on a loopback listener; otherwise no one (a password file alone gives
// only MQTT users, who are not the operator).
func (s *Server) deadLetterMode() string {
	switch {
	case s.src.DeadLetters == nil:
		return modeOff
	case s.src.Token != "":
		return modeAuth
	case s.loopback && s.src.CheckPassword == nil:
		return modeLoopback
	}
	return modeRefused
}

// noDeadLetterHint tells an operator what to configure to manage dead
// letters over HTTP.
const noDeadLetterHint = "dead letters hold every device's messages and are the operator's: set ops.token " +
	"(or, with no broker.password_file, bind ops.address to 127.0.0.1), or stop the gateway and use fieldgate db deadletters on the state file"

// operator checks that a dead-letter request comes from the operator and
// names it for the log; when it returns false it has written the refusal.
func (s *Server) operator(w http.ResponseWriter, r *http.Request) (who string, ok bool) {
	switch s.deadLetterMode() {
	case modeOff:
		plain(w, http.StatusNotImplemented, "this gateway keeps no dead letters\n")
		return "", false
	case modeRefused:
		plain(w, http.StatusForbidden, noDeadLetterHint+"\n")
		return "", false
	case modeLoopback:
		if !loopbackHost(r.Host) {
			plain(w, http.StatusForbidden, fmt.Sprintf("dead letters without credentials are served only at a loopback host such as 127.0.0.1 or localhost, not %q; or set ops.token\n", r.Host))
			return "", false
		}
		return "loopback", true
	}
	cand, found := bearer(r)
	if !found && r.PostForm != nil && r.PostForm.Get("token") != "" {
		cand, found = r.PostForm.Get("token"), true
	}
	if !found {
		if _, pass, basic := r.BasicAuth(); basic {
			cand, found = pass, true
		}
	}
	if found && equalSecret(cand, s.src.Token) {
		return "token", true
	}
	if found {
		s.refused.login.Add(1)
		s.log.Warn("refused a dead-letter request with wrong credentials", "remote", r.RemoteAddr, "bridge", r.PathValue("name"))
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="fieldgate"`)
	plain(w, http.StatusUnauthorized, "dead letters need the ops token (Authorization: Bearer, the form field token, or as the password of HTTP basic auth); an MQTT user's login is not enough\n")
	return "", false
}

// knownBridge answers 404 unless a bridge is named name.
func (s *Server) knownBridge(w http.ResponseWriter, name string) bool {
	if slices.ContainsFunc(call(s.src.Bridges), func(b Bridge) bool { return b.Name == name }) {
		return true
	}
	var names []string
	for _, b := range call(s.src.Bridges) {
		names = append(names, b.Name)
	}
	plain(w, http.StatusNotFound, fmt.Sprintf("no bridge is named %q; the bridges are: %s\n", name, strings.Join(names, ", ")))
	return false
}

// listDeadLetters serves GET /bridges/{name}/dead-letters.
func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.operator(w, r); !ok {
		return
	}
	name := r.PathValue("name")
	if !s.knownBridge(w, name) {
		return
	}
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			plain(w, http.StatusBadRequest, fmt.Sprintf("limit %q is not a positive number\n", v))
			return
		}
		limit = n
	}
	list, err := s.src.DeadLetters(name, limit)
	if err != nil {
		s.deadLetterError(w, err)
		return
	}
	if list == nil {
		list = []DeadLetter{}
	}
	body, err := json.Marshal(list)
	if err != nil {
		plain(w, http.StatusInternalServerError, err.Error()+"\n")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(append(body, '\n'))
}

// retryDeadLetters serves POST /bridges/{name}/dead-letters/retry.
func (s *Server) retryDeadLetters(w http.ResponseWriter, r *http.Request) {
	s.actOnDeadLetters(w, r, "retry", s.src.RetryDeadLetters)
}

// dropDeadLetters serves POST /bridges/{name}/dead-letters/drop.
func (s *Server) dropDeadLetters(w http.ResponseWriter, r *http.Request) {
	s.actOnDeadLetters(w, r, "drop", s.src.DropDeadLetters)
}

func (s *Server) actOnDeadLetters(w http.ResponseWriter, r *http.Request, verb string, act func(string, []uint64) (int, error)) {
	if act == nil {
		plain(w, http.StatusNotImplemented, "this gateway keeps no dead letters\n")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSeqFormBytes)
	if err := r.ParseForm(); err != nil {
		plain(w, http.StatusBadRequest, "cannot read the form: "+err.Error()+"\n")
		return
	}
	who, ok := s.operator(w, r)
	if !ok {
		return
	}
	name := r.PathValue("name")
	if !s.knownBridge(w, name) {
		return
	}
	seqs, err := formSeqs(r.PostForm["seq"])
	if err != nil {
		plain(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	all := r.PostForm.Get("all")
	switch {
	case all != "" && all != "true":
		plain(w, http.StatusBadRequest, fmt.Sprintf("the form field all must be true, not %q\n", all))
		return
	case all == "true" && len(seqs) > 0:
		plain(w, http.StatusBadRequest, "name the dead letters with seq, or all=true, not both\n")
		return
	case all == "" && len(seqs) == 0:
		plain(w, http.StatusBadRequest, "name the dead letters to "+verb+" with seq=N (repeated, or N,M,…), or all=true for every one\n")
		return
	}
	n, err := act(name, seqs)
	if n > 0 || err == nil {
		s.log.Info("dead letters acted on from the ops endpoint", "bridge", name, "action", verb, "messages", n, "by", who, "remote", r.RemoteAddr)
	}
	if err != nil {
		s.deadLetterError(w, fmt.Errorf("%d done, then: %w", n, err))
		return
	}
	past := map[string]string{"retry": "retried", "drop": "dropped"}[verb]
	plain(w, http.StatusOK, fmt.Sprintf("%s %d dead letters of bridge %s\n", past, n, name))
}

// deadLetterError answers an error of the Sources' dead-letter
// functions: 404 for what does not exist, 409 for what the bridge
// refused (a full outbox, a route no longer configured) or failed at.
func (s *Server) deadLetterError(w http.ResponseWriter, err error) {
	code := http.StatusConflict
	if errors.Is(err, ErrNotFound) {
		code = http.StatusNotFound
	}
	plain(w, code, err.Error()+"\n")
}

// formSeqs reads sequence numbers from form values, each one number or
// several separated by commas.
func formSeqs(values []string) ([]uint64, error) {
	var seqs []uint64
	for _, v := range values {
		for f := range strings.SplitSeq(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("seq %q is not a dead letter's number (1 or more)", f)
			}
			seqs = append(seqs, n)
		}
	}
	return seqs, nil
}
