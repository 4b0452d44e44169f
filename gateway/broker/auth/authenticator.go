package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/crypto/bcrypt"
)

// cacheSize bounds the remembered successful checks. An entry costs about
// 150 bytes besides the username, so the cache stays under a megabyte; 4096
// is more devices than one gateway serves. Only a correct password adds an
// entry, so strangers cannot flood it.
const cacheSize = 4096

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
