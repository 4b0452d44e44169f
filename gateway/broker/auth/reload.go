package auth

import (
	"slices"
)

// Changes is what a reload of a password file changed, by username; it
// never holds a hash.
type Changes struct {
	Added   []string // users the new file has and the old one had not
	Removed []string // users the old file had and the new one has not
	Changed []string // users whose hash differs: a new password
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Reload reads the password file at path again through p's (non-nil)
// Authenticator and forgets the remembered checks of the users it removes
// or whose password it changes. On an error p stays as it was and the
// caller keeps using it: a file that no longer parses locks nobody out.
func (p *Passwords) Reload(path string) (*Passwords, Changes, error) {
	next, err := p.auth.LoadPasswords(path)
	if err != nil {
		return nil, Changes{}, err
	}
	c := p.Diff(next)
	p.auth.Forget(c.Removed...)
	p.auth.Forget(c.Changed...)
	return next, c, nil
}

// Diff lists the users next adds, removes and gives a new hash,
// compared with p, each sorted.
func (p *Passwords) Diff(next *Passwords) Changes {
	var c Changes
	for u, h := range next.users {
		switch old, ok := p.users[u]; {
		case !ok:
			c.Added = append(c.Added, u)
		case old != h:
			c.Changed = append(c.Changed, u)
		}
	}
	for u := range p.users {
		if _, ok := next.users[u]; !ok {
			c.Removed = append(c.Removed, u)
		}
	}
	slices.Sort(c.Added)
	slices.Sort(c.Removed)
	slices.Sort(c.Changed)
	return c
}

// SameEntry reports whether next holds user with the hash p has for it: a
// login p verified stays valid under next. It is false for a user p does
// not hold.
func (p *Passwords) SameEntry(next *Passwords, user string) bool {
	h, ok := p.users[user]
	return ok && next != nil && next.users[user] == h
}
