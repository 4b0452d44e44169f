package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"

	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/matcher"
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
const MaxUsernameLen = 65535

// cacheSize bounds the remembered successful checks. An entry costs about
// 150 bytes besides the username, so the cache stays under a megabyte; 4096
// is more devices than one gateway serves. Only a correct password adds an
// entry, so strangers cannot flood it.
const cacheSize = 4096

// dummyTail is the salt and digest of a bcrypt hash of 32 random bytes that
// were then thrown away. Unknown users are compared against it, with the
// cost the file mostly uses, so that they cost what known users cost; the
// result is ignored, so no password is ever accepted through it.
const dummyTail = "9CAoYxDtqfGedxbX.fYZz.h.kOWFtrWLJhEgBMqz/KmbMNMB6oRxy"

// bcryptSlots bounds the bcrypt computations running at once in the
// process. It leaves one CPU for routing, so that a storm of connections
// slows logins, not the messages of clients already connected.
var bcryptSlots = make(chan struct{}, max(1, runtime.NumCPU()-1))

// cacheKey is mixed into every cached digest, so that the digests mean
// nothing outside this process and no precomputed table of SHA-256 sums
// of common passwords applies to them.
var cacheKey = func() (k [32]byte) {
	rand.Read(k[:])
	return k
}()

// checked is the process's cache of successful checks. It outlives a
// Passwords: after a reload, a device whose hash did not change is still
// known, while a changed hash no longer matches its entries.
var checked = newCache(cacheSize)

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
	cache *cache
}

// LoadPasswords reads a password file, reporting every bad line in a *FileError.
func LoadPasswords(path string) (*Passwords, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read password file: %w", err)
	}
	return parsePasswords(path, data)
}

func parsePasswords(name string, data []byte) (*Passwords, error) {
	p := &Passwords{users: map[string]string{}, cache: checked}
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
		return "the username is longer than 65535 bytes, the most MQTT carries"
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

// Check reports whether password is user's password. It takes about as long
// for an unknown user as for a known one; unless the check is remembered,
// it may wait for a bcrypt slot.
func (p *Passwords) Check(user string, password []byte) bool {
	if p == nil || len(password) == 0 || len(password) > MaxPasswordLen {
		return false
	}
	hash, known := p.users[user]
	sum := passwordSum(password)
	if known && p.cache.hit(user, hash, sum) {
		return true
	}
	target := hash
	if !known {
		target = p.dummy
	}
	bcryptSlots <- struct{}{}
	err := bcrypt.CompareHashAndPassword([]byte(target), password)
	<-bcryptSlots
	if !known || err != nil {
		return false
	}
	p.cache.add(user, hash, sum)
	return true
}

// HashPassword returns a bcrypt hash of password at HashCost, for a password file.
func HashPassword(password []byte) (string, error) {
	switch {
	case len(password) == 0:
		return "", ErrEmptyPassword
	case len(password) > MaxPasswordLen:
		return "", ErrPasswordTooLong
	}
	bcryptSlots <- struct{}{}
	h, err := bcrypt.GenerateFromPassword(password, hashCost)
	<-bcryptSlots
	if err != nil {
		return "", fmt.Errorf("auth: hash password: %w", err)
	}
	return string(h), nil
}

// cache remembers successful checks by username: the hash that was checked
// and a keyed digest of the password that matched it. A hit needs both the
// same hash and the same password.
type cache struct {
	max int
	mu  sync.Mutex
	m   map[string]cached
}

type cached struct {
	hash string
	sum  [sha256.Size]byte
}

func newCache(max int) *cache {
	return &cache{max: max, m: map[string]cached{}}
}

func passwordSum(password []byte) (sum [sha256.Size]byte) {
	h := sha256.New()
	h.Write(cacheKey[:])
	h.Write(password)
	h.Sum(sum[:0])
	return sum
}

func (c *cache) hit(user, hash string, sum [sha256.Size]byte) bool {
	c.mu.Lock()
	e, ok := c.m[user]
	c.mu.Unlock()
	return ok && e.hash == hash && subtle.ConstantTimeCompare(e.sum[:], sum[:]) == 1
}

func (c *cache) add(user, hash string, sum [sha256.Size]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[user]; !ok && len(c.m) >= c.max {
		// Map iteration starts at a random entry: an arbitrary eviction.
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	// The username may point into a packet buffer; keep only its bytes.
	c.m[strings.Clone(user)] = cached{hash: hash, sum: sum}
}

// SetPassword adds user to the password file at path, or replaces the
// user's entry, leaving every other line as it was. It creates the file,
// with mode 0600, when it is missing, and replaces it atomically.
func SetPassword(path, user string, password []byte) error {
	fail := func(err error) error {
		return fmt.Errorf("auth: set password of %q in %s: %w", user, path, err)
	}
	if err := ValidateUsername(user); err != nil {
		return fail(err)
	}
	hash, err := HashPassword(password)
	if err != nil {
		return fail(err)
	}
	if err := rewrite(path, user, user+":"+hash); err != nil {
		return fail(err)
	}
	return nil
}

// DeleteUser removes user's entry from the password file at path, leaving
// every other line as it was; it fails with ErrNoUser when there is none.
func DeleteUser(path, user string) error {
	if err := rewrite(path, user, ""); err != nil {
		return fmt.Errorf("auth: delete %q from %s: %w", user, path, err)
	}
	return nil
}

// rewrite replaces user's entries in the file at path with entry, or
// deletes them when entry is empty. A new entry for a user the file lacks
// goes at the end; a file that is missing is created only to add one.
func rewrite(path, user, entry string) error {
	// Replace the file a symbolic link points to, not the link.
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	var data []byte
	var old fs.FileInfo
	f, err := os.Open(path)
	switch {
	case err == nil:
		old, err = f.Stat()
		if err == nil {
			data, err = io.ReadAll(f)
		}
		f.Close()
		if err != nil {
			return err
		}
	case errors.Is(err, fs.ErrNotExist) && entry != "":
	default:
		return err
	}

	var out strings.Builder
	out.Grow(len(data) + len(entry) + 1)
	found := false
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if u, _, isEntry, ok := splitEntry(line); !isEntry || !ok || u != user {
			out.WriteString(line)
			continue
		}
		if !found && entry != "" {
			out.WriteString(entry)
			if strings.HasSuffix(line, "\r\n") {
				out.WriteString("\r\n")
			} else {
				out.WriteString("\n")
			}
		}
		found = true
	}
	if !found {
		if entry == "" {
			return ErrNoUser
		}
		if out.Len() > 0 && !strings.HasSuffix(out.String(), "\n") {
			out.WriteString("\n")
		}
		out.WriteString(entry + "\n")
	}
	return writeAtomic(path, []byte(out.String()), old)
}

// writeAtomic replaces the file at path with data so that after a power cut
// the file holds either its old content or the new, never a mix. The new
// file keeps the permissions and owner of old, the file it replaces; with
// none it gets mode 0600.
func writeAtomic(path string, data []byte, old fs.FileInfo) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()

	mode := fs.FileMode(0o600)
	if old != nil {
		mode = old.Mode().Perm()
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := keepOwner(f, old); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	err = f.Close()
	done = true
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	// The rename is durable only once the directory is.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// keepOwner gives f the owner and group of old, so that a file the service
// user owns stays readable by it when root edits it.
func keepOwner(f *os.File, old fs.FileInfo) error {
	if old == nil {
		return nil
	}
	uid, gid, ok := owner(old)
	if !ok {
		return nil
	}
	now, err := f.Stat()
	if err != nil {
		return err
	}
	if u, g, ok := owner(now); ok && u == uid && g == gid {
		return nil
	}
	if err := f.Chown(uid, gid); err != nil {
		return fmt.Errorf("keep owner %d:%d: %w", uid, gid, err)
	}
	return nil
}

// owner returns the user and group that own a file, where the platform
// records them. On Unix fi.Sys() is a *syscall.Stat_t; its fields are read
// by name because that type does not exist on every platform, and this
// file builds on all of them.
func owner(fi fs.FileInfo) (uid, gid int, ok bool) {
	v := reflect.ValueOf(fi.Sys())
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return 0, 0, false
	}
	u, g := v.Elem().FieldByName("Uid"), v.Elem().FieldByName("Gid")
	if !u.IsValid() || !g.IsValid() || !u.CanUint() || !g.CanUint() {
		return 0, 0, false
	}
	return int(u.Uint()), int(g.Uint()), true
}

// access is what a rule grants, or that it denies.
type access uint8

const (
	accessRead access = 1 << iota
	accessWrite
	accessDeny
)

// rule is a configured ACL rule, prepared.
type rule struct {
	user   string // "" for every client
	filter string // as configured, with %u and %c
	access access
	all    bool // denies every topic: a deny rule that could not be understood

	userVar   bool // the filter uses %u
	clientVar bool // the filter uses %c
}

// ACL is the broker's access control list. It is immutable, so any number of
// goroutines may use it at once; a reload builds a new one.
type ACL struct {
	open  bool // no rules: everything is allowed
	rules []rule
}

// NewACL prepares rules; with none, every client may do everything.
func NewACL(rules []config.ACLRule) *ACL {
	a := &ACL{open: len(rules) == 0}
	for _, r := range rules {
		p := rule{
			user:      r.User,
			filter:    r.Topic,
			userVar:   strings.Contains(r.Topic, "%u"),
			clientVar: strings.Contains(r.Topic, "%c"),
		}
		if p.user == "*" {
			p.user = ""
		}
		switch r.Access {
		case "read":
			p.access = accessRead
		case "write":
			p.access = accessWrite
		case "readwrite":
			p.access = accessRead | accessWrite
		case "deny":
			p.access = accessDeny
		default:
			// Fail closed: the rule may have been meant to deny.
			p.access, p.all = accessDeny, true
		}
		// Check the filter as configuration validation does, with
		// stand-ins for the variables.
		standIn := strings.NewReplacer("%u", "u", "%c", "c").Replace(r.Topic)
		if matcher.ValidateFilter(standIn) != nil {
			if p.access != accessDeny {
				continue
			}
			p.all = true
		}
		a.rules = append(a.rules, p)
	}
	return a
}

// Permissions are what an ACL lets one client do: the rules that apply to it,
// with %u and %c substituted. The zero value allows nothing.
type Permissions struct {
	open   bool
	grants []grant
}

type grant struct {
	filter string
	access access
	all    bool
}

// For returns the permissions of the client with this username (empty
// for none) and client id. A broker keeps them for the life of a connection,
// so checks per message substitute nothing and allocate nothing, and asks
// the new ACL after a reload. A nil ACL allows everything, as one without
// rules does.
func (a *ACL) For(user, clientID string) Permissions {
	if a == nil || a.open {
		return Permissions{open: true}
	}
	var p Permissions
	for i := range a.rules {
		r := &a.rules[i]
		if r.user != "" && r.user != user {
			continue
		}
		f, ok := r.filter, true
		if !r.all {
			f, ok = r.expand(user, clientID)
		}
		if ok {
			p.grants = append(p.grants, grant{filter: f, access: r.access, all: r.all})
		}
	}
	return p
}

// expand substitutes the username and client id into the rule's filter. It
// reports false when the rule does not apply: a value it needs is empty, or
// would widen the filter.
func (r *rule) expand(user, clientID string) (string, bool) {
	if !r.userVar && !r.clientVar {
		return r.filter, true
	}
	if r.userVar && !substitutable(user) || r.clientVar && !substitutable(clientID) {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(r.filter) + len(user) + len(clientID))
	f := r.filter
	for {
		i := strings.IndexByte(f, '%')
		if i < 0 || i+1 == len(f) {
			b.WriteString(f)
			break
		}
		b.WriteString(f[:i])
		switch f[i+1] {
		case 'u':
			b.WriteString(user)
			f = f[i+2:]
		case 'c':
			b.WriteString(clientID)
			f = f[i+2:]
		default:
			b.WriteByte('%')
			f = f[i+1:]
		}
	}
	out := b.String()
	// A value beginning with '$' must not move the rule into the
	// server's topics, such as $SYS.
	if strings.HasPrefix(out, "$") && !strings.HasPrefix(r.filter, "$") {
		return "", false
	}
	return out, true
}

// substitutable reports whether a username or client id may stand in a
// filter without widening it: a wildcard or a level separator would.
func substitutable(v string) bool {
	return v != "" && !strings.ContainsAny(v, "+#/")
}

// CanPublish reports whether the client may publish to topic.
func (p Permissions) CanPublish(topic string) bool { return p.allows(topic, accessWrite) }

// CanRead reports whether a message on topic may be delivered to the client.
func (p Permissions) CanRead(topic string) bool { return p.allows(topic, accessRead) }

func (p Permissions) allows(topic string, want access) bool {
	if p.open {
		return true
	}
	ok := false
	for _, g := range p.grants {
		switch {
		case g.access == accessDeny:
			if g.all || matcher.Matches(g.filter, topic) {
				return false
			}
		case !ok && g.access&want != 0:
			ok = matcher.Matches(g.filter, topic)
		}
	}
	return ok
}

// CanSubscribe reports whether the client may subscribe to filter: one rule
// lets it read every topic the filter can match and no deny rule matches
// any of them. A shared subscription is judged by the filter after
// $share/{group}/.
func (p Permissions) CanSubscribe(filter string) bool {
	if _, inner, shared := matcher.SplitShared(filter); shared {
		filter = inner
	}
	if p.open {
		return true
	}
	if filter == "" {
		return false
	}
	ok := false
	for _, g := range p.grants {
		switch {
		case g.access == accessDeny:
			if g.all || overlaps(g.filter, filter) {
				return false
			}
		case !ok && g.access&accessRead != 0:
			ok = covers(g.filter, filter)
		}
	}
	return ok
}

// CanPublish reports whether the client may publish to topic.
func (a *ACL) CanPublish(user, clientID, topic string) bool {
	return a.For(user, clientID).CanPublish(topic)
}

// CanSubscribe reports whether the client may subscribe to filter.
func (a *ACL) CanSubscribe(user, clientID, filter string) bool {
	return a.For(user, clientID).CanSubscribe(filter)
}

// CanRead reports whether a message on topic may be delivered to the client.
func (a *ACL) CanRead(user, clientID, topic string) bool {
	return a.For(user, clientID).CanRead(topic)
}

// covers reports whether the rule filter matches every topic the
// subscription filter sub matches. It answers level by level, so it is
// sound but not complete: "+/#" matches every topic "#" does, yet does not
// cover it here.
func covers(rule, sub string) bool {
	if wildStart(rule) && strings.HasPrefix(sub, "$") {
		return false // [MQTT-4.7.2-1]
	}
	for {
		r, rRest, rMore := strings.Cut(rule, "/")
		s, sRest, sMore := strings.Cut(sub, "/")
		switch {
		case r == "#":
			return true
		case s == "#":
			// It matches its parent and any deeper level; only "#" does.
			return false
		case r != "+" && r != s:
			return false
		}
		switch {
		case !rMore && !sMore:
			return true
		case !sMore:
			// The rule goes deeper than sub; only "#", which also
			// matches its parent, reaches back to sub's topics.
			return rRest == "#"
		case !rMore:
			return false
		}
		rule, sub = rRest, sRest
	}
}

// overlaps reports whether some topic matches both filters.
func overlaps(a, b string) bool {
	// A filter starting with a wildcard matches no topic beginning with
	// '$'; one starting with '$' matches only such topics [MQTT-4.7.2-1].
	if wildStart(a) && strings.HasPrefix(b, "$") || wildStart(b) && strings.HasPrefix(a, "$") {
		return false
	}
	for first := true; ; first = false {
		x, xRest, xMore := strings.Cut(a, "/")
		y, yRest, yMore := strings.Cut(b, "/")
		switch {
		case x == "#" || y == "#":
			return true
		case x != "+" && y != "+" && x != y:
			return false
		}
		switch {
		case !xMore && !yMore:
		case !xMore:
			if yRest != "#" {
				return false
			}
		case !yMore:
			if xRest != "#" {
				return false
			}
		default:
			a, b = xRest, yRest
			continue
		}
		// The common topic ends at this level. If it is the first and
		// must be empty, the topic is "", which is no topic at all: "+"
		// and "/#" share none.
		return !first || x != "" && y != ""
	}
}

func wildStart(filter string) bool {
	return filter != "" && (filter[0] == '+' || filter[0] == '#')
}
