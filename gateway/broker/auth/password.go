package auth

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"golang.org/x/crypto/bcrypt"
)

// HashCost is the bcrypt cost HashPassword uses. Each step doubles the work.
// At 10 a check takes about 0.3 s on a Pi Zero 2 W, the slowest board we
// support: guessing the passwords of a stolen file stays expensive, while a
// device connecting after a gateway restart waits a fraction of a second,
// once, since successful checks are remembered.
const HashCost = 10

// maxCost is the highest bcrypt cost LoadPasswords accepts. 14 is 16 times
// HashCost, about 5 s per check on a Pi Zero 2 W; beyond it a handful of
// connection attempts would hold the CPUs for minutes.
const maxCost = 14

// hashCost is what HashPassword uses; tests lower it for speed.
var hashCost = HashCost

// MaxPasswordLen is the longest password bcrypt uses every byte of.
const MaxPasswordLen = 72

// MaxUsernameLen is the longest username MQTT can carry [MQTT-1.5.4-1].
const MaxUsernameLen = mqttwire.MaxString

// dummyTail is the salt and digest of a bcrypt hash of 32 random bytes that
// were then thrown away. Unknown users are compared against it, with the
// cost the file mostly uses, so that they cost what known users cost; the
// result is ignored, so no password is ever accepted through it.
const dummyTail = "9CAoYxDtqfGedxbX.fYZz.h.kOWFtrWLJhEgBMqz/KmbMNMB6oRxy"

// Errors, compare with errors.Is.
var (
	// ErrInvalid is what every *FileError wraps.
	ErrInvalid = errors.New("auth: invalid password file")
	// ErrUsername reports a username a password file cannot hold.
	ErrUsername = errors.New("invalid username")
	// ErrNoUser reports that DeleteUser found no entry for the user.
	ErrNoUser = errors.New("no such user")
	// ErrEmptyPassword reports an empty password, which is never accepted.
	ErrEmptyPassword = errors.New("the password is empty")
	// ErrPasswordTooLong reports a password over MaxPasswordLen bytes.
	ErrPasswordTooLong = errors.New("the password is longer than 72 bytes, the most bcrypt uses")
)

// Problem is one bad line of a password file.
type Problem struct {
	File string // the file as named to LoadPasswords
	Line int    // 1-based
	User string // the entry's username when the line has a readable one
	Msg  string // what is wrong and how to put it right
}

// String formats the problem as file:line: user "name": message.
func (p Problem) String() string {
	if p.User == "" {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	u := p.User
	if len(u) > 64 {
		u = u[:64] + "…"
	}
	return fmt.Sprintf("%s:%d: user %q: %s", p.File, p.Line, u, p.Msg)
}

// FileError lists every bad line of a password file.
type FileError struct {
	Problems []Problem
}

// Error returns all problems, one per line.
func (e *FileError) Error() string {
	if len(e.Problems) == 1 {
		return "auth: " + e.Problems[0].String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "auth: %d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *FileError) Unwrap() error { return ErrInvalid }

// Passwords is a loaded password file. It does not change once loaded; Check
// is safe for concurrent use.
type Passwords struct {
	users map[string]string // username to bcrypt hash
	dummy string            // the hash unknown users are compared against
	auth  *Authenticator    // the bcrypt slots and cache its checks use
}

// LoadPasswords reads a password file, reporting every bad line in a
// *FileError. Its checks go through an Authenticator of its own: it suits a
// command that checks the file, while a server loads its file with its
// Authenticator's LoadPasswords.
func LoadPasswords(path string) (*Passwords, error) {
	return NewAuthenticator().LoadPasswords(path)
}

// parsePasswords parses the password file name holds, without an
// Authenticator.
func parsePasswords(name string, data []byte) (*Passwords, error) {
	p := &Passwords{users: map[string]string{}}
	seen := map[string]int{} // username to the line that first has it
	costs := map[int]int{}   // bcrypt cost to how many entries use it
	var problems []Problem
	bad := func(line int, user, msg string) {
		problems = append(problems, Problem{File: name, Line: line, User: user, Msg: msg})
	}
	for i, text := range strings.Split(string(data), "\n") {
		n := i + 1
		user, hash, isEntry, ok := splitEntry(text)
		switch {
		case !isEntry:
			continue
		case !ok:
			// The line is not repeated: it may be a password typed in
			// by mistake.
			bad(n, "", "no ':' between username and hash; write entries with fieldgate passwd")
			continue
		}
		if why := usernameProblem(user); why != "" {
			bad(n, user, why)
			continue
		}
		if first, dup := seen[user]; dup {
			bad(n, user, fmt.Sprintf("duplicate of line %d; keep one entry", first))
			continue
		}
		seen[user] = n
		cost, why := checkHash(hash)
		if why != "" {
			bad(n, user, why)
			continue
		}
		p.users[user] = hash
		costs[cost]++
	}
	if len(problems) > 0 {
		return nil, &FileError{Problems: problems}
	}

	// Unknown users should cost what most known users cost.
	common := HashCost
	for c, k := range costs {
		if k > costs[common] || k == costs[common] && c > common {
			common = c
		}
	}
	p.dummy = fmt.Sprintf("$2a$%02d$%s", common, dummyTail)
	return p, nil
}

// splitEntry splits one line of a password file. isEntry is false for a
// blank line or a comment, ok false for an entry without ':'.
func splitEntry(line string) (user, hash string, isEntry, ok bool) {
	line = strings.TrimRight(line, " \t\r\n")
	if line == "" || line[0] == '#' {
		return "", "", false, false
	}
	user, hash, ok = strings.Cut(line, ":")
	return user, hash, true, ok
}

// ValidateUsername reports, wrapping ErrUsername, why a password file cannot
// hold user; nil if it can.
func ValidateUsername(user string) error {
	if why := usernameProblem(user); why != "" {
		return fmt.Errorf("%w: %s", ErrUsername, why)
	}
	return nil
}

func usernameProblem(user string) string {
	switch {
	case user == "":
		return "the username is empty"
	case len(user) > MaxUsernameLen:
		return fmt.Sprintf("the username is longer than %d bytes, the most MQTT carries", MaxUsernameLen)
	case strings.Contains(user, ":"):
		return "the username contains ':', which separates it from the hash"
	case user[0] == '#':
		return "the username begins with '#', which would make its line a comment"
	case !utf8.ValidString(user):
		return "the username is not valid UTF-8"
	}
	for _, r := range user {
		if unicode.IsControl(r) {
			return fmt.Sprintf("the username contains the control character U+%04X", r)
		}
	}
	return ""
}

// checkHash returns a hash's bcrypt cost, or what is wrong with it.
func checkHash(hash string) (cost int, problem string) {
	const notBcrypt = "hash is not a bcrypt hash; write entries with fieldgate passwd"
	// $2?$cc$ then 22 characters of salt and 31 of digest.
	if len(hash) != 60 || hash[6] != '$' {
		return 0, notBcrypt
	}
	switch hash[:4] {
	case "$2a$", "$2b$", "$2y$":
	default:
		return 0, notBcrypt
	}
	d1, d2 := hash[4], hash[5]
	if d1 < '0' || d1 > '9' || d2 < '0' || d2 > '9' {
		return 0, notBcrypt
	}
	for i := 7; i < len(hash); i++ {
		c := hash[i]
		if !(c == '.' || c == '/' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return 0, notBcrypt
		}
	}
	cost = int(d1-'0')*10 + int(d2-'0')
	switch {
	case cost < bcrypt.MinCost || cost > bcrypt.MaxCost:
		return 0, fmt.Sprintf("bcrypt cost %d is outside bcrypt's range, %d to %d; write the entry again with fieldgate passwd", cost, bcrypt.MinCost, bcrypt.MaxCost)
	case cost > maxCost:
		perCheck := 300 * time.Millisecond << (cost - HashCost)
		return 0, fmt.Sprintf("bcrypt cost %d would take about %s per check on a Pi Zero 2 W; use at most %d, or write the entry again with fieldgate passwd (cost %d)",
			cost, perCheck.Round(time.Second), maxCost, HashCost)
	}
	return cost, ""
}

// Len returns the number of users.
func (p *Passwords) Len() int {
	if p == nil {
		return 0
	}
	return len(p.users)
}

// HashPassword returns a bcrypt hash of password at HashCost, for a password
// file. It takes no bcrypt slot: it serves fieldgate passwd, which hashes one
// password and exits, not a server's checks.
func HashPassword(password []byte) (string, error) {
	switch {
	case len(password) == 0:
		return "", ErrEmptyPassword
	case len(password) > MaxPasswordLen:
		return "", ErrPasswordTooLong
	}
	h, err := bcrypt.GenerateFromPassword(password, hashCost)
	if err != nil {
		return "", fmt.Errorf("auth: hash password: %w", err)
	}
	return string(h), nil
}
