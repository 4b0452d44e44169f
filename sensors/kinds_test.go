package sensors

import "sync"

// kindsMu serialises the tests' changes to the table of kinds. Only tests
// change it, and only before or between the tests that read it.
var kindsMu sync.Mutex

// Register adds a kind of the tests' own, such as a scripted device, to
// the table of kinds. Registering a name twice panics.
func Register(k Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[k.Name]; dup {
		panic("sensors: kind " + k.Name + " registered twice")
	}
	kinds[k.Name] = k
}
