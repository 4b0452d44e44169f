// Package matcher owns MQTT topic names and topic filters: their
// validation, their algebra (whether two filters share a topic, whether one
// covers another), and the subscription index that maps a published topic
// to the sessions that receive it.
//
// # Semantics
//
// '+' matches exactly one level; '#' matches its parent level and any number
// of further levels, so "a/#" matches "a"; levels may be empty ("a//b",
// "/a", "a/"); a topic beginning with '$' is never matched by a filter whose
// first level is a wildcard, but "$SYS/#" matches "$SYS/uptime". A filter
// "$share/{group}/{filter}" is a shared subscription: each message goes to
// one member of the group.
//
// # The index
//
// The index is built for a gateway with little memory and many
// subscriptions, most of them exact and the rest following a handful of
// patterns. It keeps one entry per stored filter and, for each distinct
// filter shape, an open-addressing hash table of those entries.
//
// A filter's shape is its level count, which of its levels are '+', and
// whether it ends in '#': "site/+/temp" and "site/+/hum" share a shape,
// "devices/+/cmd/#" has another, and every exact filter of n levels has the
// shape "n literal levels". A filter's key, in its shape's table, sums one
// term per literal level (a seeded hash of the level's bytes times an odd
// constant of its position). A topic is hashed once, a machine word
// at a time, into prefix sums of its level terms; its key for any shape is
// then the prefix sum up to the shape's depth, less the terms at the
// shape's '+' levels. Matching a topic costs one table probe per distinct
// shape that fits its depth, however many subscriptions there are. A table
// per shape keeps the tables of the wildcard patterns small, so with a
// million subscriptions their probes still hit the cache and only the big
// table of exact filters costs a trip to memory.
//
// This is the per-level hash and wildcard mask of the topic-hash idea, with
// its weaknesses removed: instead of one 8-bit checksum per level packed
// into a word and a scan over every wildcard subscription, each level
// contributes a full-width term and the mask (the shape) selects a table
// key, so wildcard filters are found by lookup; each shape has its own
// table, so filters that share a hash but differ in mask never meet; depth is
// part of the shape, so no level value stands for "absent"; and the hash is
// seeded with a per-index secret, so crafted topics cannot pile up in one
// probe run. Keys are 32 bits, the width the table compares. Filters
// deeper than 32 levels have no shape: they sit on a list checked one by
// one, for topics deeper than 32 levels only.
//
// Hashes only prune. Every candidate is verified against the topic with
// Matches before it is delivered, so collisions cost time, never
// correctness.
//
// The number of distinct shapes bounds the work per publish. Real fleets
// use a handful; a client subscribing to many differently shaped filters
// of one depth makes every publish of that depth probe each of them, so
// the broker must bound subscriptions per client. Shapes reports the count.
//
// Entries are compact: the filter string (kept once, as subscribed), and
// one 8-byte cell holding either the only subscriber (the session handle
// and the options bits in one word, the subscription identifier in the
// other) or the index of a member list of such cells, sorted by handle.
// Entries live in fixed pages, so growth never copies the whole index. A
// table cell is 8 bytes: the key, which scaled to the table size gives the
// home cell, and the entry number. Tables grow by half rather than double,
// so they stay between half and three quarters full. With a million
// subscriptions a subscription costs about 42 bytes besides its filter
// string on a 64-bit board and about 32 on ARMv6/v7.
//
// Match appends to a caller's Result and allocates nothing once its buffers
// have grown. Deduplication per session (highest QoS, every identifier)
// scans linearly while few filters with one subscriber each match;
// otherwise the largest matching member list, sorted by handle, is copied
// and the others are merged into it by binary search, with the Result's own
// hash table for sessions beyond it.
//
// # Concurrency
//
// An Index is safe for concurrent use. Readers never wait for each other:
// Match read-locks one of eight lock stripes, the one dealt to its Result,
// so readers on different cores do not bounce one lock counter between
// them (with a single RWMutex, two cores matched no faster than one); a
// writer (Subscribe, Unsubscribe, SetOnline) takes every stripe for the
// microsecond an update needs. A shared group's round-robin cursor is
// advanced atomically under the read lock.
package matcher
