package storage_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/fieldgate/fieldgate/storage"
)

// A Batch gathers what one publish changes; Commit writes it with others
// in one transaction and one fsync, and only then runs its callback. That
// callback is where a broker sends its PUBACK. CommitWait does the same
// and waits.
func ExampleDB() {
	dir, err := os.MkdirTemp("", "fieldgate-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := storage.Open(filepath.Join(dir, "state.db"), storage.Options{})
	if err != nil {
		log.Fatal(err)
	}

	var b storage.Batch
	b.SetRetained(&storage.Message{Topic: "site/pump/state", Payload: []byte("on"), QoS: 1, Retain: true})
	b.OutboxPut("cloud", &storage.OutboxEntry{Seq: 1, Msg: storage.Message{Topic: "sites/7/pump/state", Payload: []byte("on"), QoS: 1}})
	if err := db.CommitWait(&b); err != nil { // durable from here on
		log.Fatal(err)
	}
	db.Close()

	// After a restart (or a power cut) the state is still there.
	db, err = storage.OpenReadOnly(filepath.Join(dir, "state.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	m, _ := db.Retained("site/pump/state")
	fmt.Printf("retained %s = %s\n", m.Topic, m.Payload)
	db.OutboxScan("cloud", 0, 10, func(e *storage.OutboxEntry) bool {
		fmt.Printf("outbox %d: %s\n", e.Seq, e.Msg.Topic)
		return true
	})
	// Output:
	// retained site/pump/state = on
	// outbox 1: sites/7/pump/state
}
