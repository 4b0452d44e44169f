// Package storage keeps fieldgate's state in one bbolt file: persistent
// sessions with their subscriptions, queued and in-flight messages and the
// QoS 2 packet identifiers awaiting PUBREL, retained messages, each
// bridge's outbox of messages waiting to be sent to its cloud broker, and
// its dead letters: the messages the cloud broker kept refusing.
//
// The durability contract:
//
//   - A Batch passed to Commit is on disk, fsynced, when its done callback
//     runs with a nil error; with an error, none of it is. Nothing else
//     about the database changes in between.
//   - Batches are applied in the order they are committed, each whole or
//     not at all. Commits arriving while another commit runs are grouped
//     into the next transaction: one fsync serves them all. An SD card
//     manages a few hundred fsyncs a second; grouping keeps that the bound
//     on transactions, not on publishes.
//   - Callers build batches concurrently and commit them when they are
//     done, so two batches that touch one record can arrive in the other
//     order than their writers acted. A session numbers its queue, and a
//     bridge its outbox, with sequences it does not reuse until the queue
//     is deleted (DeleteSession) or the outbox opened again (OutboxOpen,
//     OutboxDrop). So a Dequeue or OutboxDelete that finds no record is
//     remembered for a minute, up to 16,384 of them: the record, when it
//     comes, is not stored; and a SetInflight that finds none is applied
//     to the record when it comes. A retained write guarded with
//     GuardLast applies only if no later change of its topic has been
//     applied, so the later change is the one kept, and an earlier one is
//     never skipped for a later one not yet in the file. A transaction
//     that fails takes back what it did to either.
//   - CommitLazy batches (what QoS 0 publishes change) never cause an
//     fsync of their own: they ride with the next Commit, or go out
//     within LazyDelay when none comes.
//   - An outbox entry is durable with the batch that puts it, like any
//     other write: put in the same batch as a publish's other effects and
//     committed with Commit, it is on disk before the publisher can be
//     told its message was stored; committed with CommitLazy, it can be
//     lost to a power cut within LazyDelay, with the rest of its batch.
//   - An outbox entry stays until a committed OutboxDelete or OutboxDrop
//     removes it. A delete that was not yet on disk at a power cut leaves
//     its entry to be sent again after the restart: a durable entry is
//     sent at least once.
//   - A failed commit (disk full, an I/O error) leaves the file as it was
//     before the transaction; later commits are tried afresh, so the
//     database recovers by itself when space returns.
//   - A file written by a newer schema is refused at Open with an error
//     that says so; an older one is migrated, in one transaction, first.
//
// Storage imports nothing else of fieldgate's: it stores records and knows
// nothing of MQTT beyond topic filters, and its callers pass it the
// topic matcher for retained lookup.
package storage
