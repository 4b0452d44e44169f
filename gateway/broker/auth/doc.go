// Package auth decides who may connect to the broker and what each client
// may publish, subscribe to and receive.
//
// # Passwords
//
// Clients prove who they are with a username and password checked against
// a password file: one "username:hash" entry per line, the hash a bcrypt
// hash ($2a$, $2b$ or $2y$), blank lines and lines beginning with '#'
// ignored. fieldgate passwd writes entries; SetPassword and DeleteUser are
// what it calls. LoadPasswords reports every bad line at once, each as
// file:line and what is wrong, and never repeats a hash or a line that
// might be a password typed in by mistake.
//
// Check is safe for concurrent use and costs about the same for a user the
// file does not name as for one it does, so its timing does not tell which
// users exist. bcrypt is slow on purpose, which a gateway must contain, and
// an Authenticator does: the broker owns one and loads its password file
// through it. It remembers a successful check (as a keyed SHA-256 of the
// password, with the hash it matched) so a device that reconnects every few
// seconds pays bcrypt once, and it limits bcrypt comparisons to one fewer
// than the number of CPUs (at least one), so that a storm of connections
// cannot take every core from message routing. bcrypt uses only the first 72 bytes of a password;
// Check refuses longer ones rather than let two passwords that share those
// bytes both succeed, and refuses empty ones.
//
// # Access control
//
// An ACL is built from the broker.acl rules of the configuration and is
// immutable: a reload builds a new one, so any number of goroutines may use
// one at once. Without rules every client may do everything. With rules,
// whatever no rule allows is refused, and a matching deny rule wins over any
// rule that allows.
//
// A rule's topic is an MQTT topic filter in which %u stands for the
// client's username and %c for its client id. A rule that uses %u does not
// apply to a client without a username, nor one that uses %c to a client
// with an empty client id. A substituted value must not widen the rule: if
// a value contains '+', '#' or '/', or would make the filter begin with '$'
// when the rule's own text does not, the rule gives that client no match,
// neither allowing nor denying. So a client id "+" gets nothing from
// "devices/%c/#", and never "devices/+/#".
//
// A publish is allowed when a write or readwrite rule's filter matches the
// topic; a message is delivered when a read or readwrite rule's filter
// does. A subscription is allowed when one read or readwrite rule covers it
// (every topic the subscription can match, that rule's filter matches too:
// matcher.Covers) and no deny rule's filter shares a single topic with it
// (matcher.Overlaps). A shared
// subscription $share/{group}/{filter} is judged by its filter. As in
// matching, a filter beginning with '+' or '#' never reaches a topic
// beginning with '$': to deny $SYS, deny "$SYS/#", not "#".
//
// A rule with an access other than read, write, readwrite or deny, or a
// deny rule whose filter is not valid, denies its users everything; an
// allow rule whose filter is not valid allows nothing. Configuration
// validation refuses both, so these only guard an ACL built in code.
package auth
