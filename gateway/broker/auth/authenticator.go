package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
)

// cacheSize bounds the remembered successful checks. An entry costs about
// 150 bytes besides the username, so the cache stays under a megabyte; 4096
// is more devices than one gateway serves. Only a correct password adds an
// entry, so strangers cannot flood it.
const cacheSize = 4096

// An Authenticator holds what every password check in a process shares: a
// bound on the bcrypt computations running at once and the cache of
// successful checks. The broker owns one, loads its password file through
// it and answers every check with it, for MQTT logins and the ops endpoint
// alike, so that the bound holds for all of them. Its methods are safe for
// concurrent use.
type Authenticator struct {
	// slots bounds the bcrypt computations running at once and those
	// waiting (limit.go). It leaves one CPU for routing, so that a storm
	// of connections slows logins, not the messages of clients already
	// connected.
	slots *slotQueue
	// sources remembers the failed logins of recent source addresses, so
	// that one that fails too often is refused without a check.
	sources *sourceTable
	// cache remembers successful checks. It outlives a Passwords: after a
	// reload through the same Authenticator, a device whose hash did not
	// change is still known, while a changed hash no longer matches its
	// entries.
	cache   *cache
	refused refusedCounts // logins refused, by Outcome
}

// NewAuthenticator returns an Authenticator with the DefaultLoginLimits,
// one bcrypt slot fewer than the CPUs (at least one) and room to remember
// cacheSize successful checks.
func NewAuthenticator() *Authenticator {
	return NewLimitedAuthenticator(DefaultLoginLimits())
}

// LoadPasswords reads a password file whose checks go through a, reporting
// every bad line in a *FileError.
func (a *Authenticator) LoadPasswords(path string) (*Passwords, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read password file: %w", err)
	}
	p, err := parsePasswords(path, data)
	if err != nil {
		return nil, err
	}
	p.auth = a
	return p, nil
}

// Check reports whether password is user's password. It takes about as long
// for an unknown user as for a known one; unless the check is remembered,
// it may wait for a bcrypt slot, and is false when the wait is refused
// (see CheckFrom, which says why).
func (p *Passwords) Check(user string, password []byte) bool {
	return p.CheckFrom(netip.Addr{}, user, password) == Accepted
}

// cache remembers successful checks by username: the hash that was checked
// and a keyed digest of the password that matched it. A hit needs both the
// same hash and the same password.
type cache struct {
	max int
	// key is mixed into every cached digest, so that the digests mean
	// nothing outside this cache and no precomputed table of SHA-256 sums
	// of common passwords applies to them.
	key [32]byte
	mu  sync.Mutex
	m   map[string]cached
}

type cached struct {
	hash string
	sum  [sha256.Size]byte
}

func newCache(max int) *cache {
	c := &cache{max: max, m: map[string]cached{}}
	rand.Read(c.key[:])
	return c
}

// sum is the digest of password that the cache keeps.
func (c *cache) sum(password []byte) (sum [sha256.Size]byte) {
	h := sha256.New()
	h.Write(c.key[:])
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

// Forget drops the remembered checks of users, as when a reload removed
// them or changed their passwords: their next login pays bcrypt again.
func (a *Authenticator) Forget(users ...string) {
	a.cache.mu.Lock()
	defer a.cache.mu.Unlock()
	for _, u := range users {
		delete(a.cache.m, u)
	}
}
