// Package uidrange is the rule of run_uids, the range of host ids that
// sandboxes run as: its defaults, its bound and the check of a range
// (Check). The config checks run_uids with it as it reads it, and
// internal/uidpool, which reserves the ids, opens a range it accepts.
//
// It imports the standard library alone and touches nothing on the
// host, so that the config builds without the pool.
package uidrange

import (
	"errors"
	"fmt"
)

// Default range: 65536 ids from 2,000,000,000, far above the ids of
// regular users (1000 and up), system users and nobody (65534), and below
// 2^31 so that no tool reads them as negative.
const (
	DefaultFirst = 2000000000
	DefaultCount = 65536
)

// DefaultDir is where every agentrun of the host reserves its ids, unless
// its config names another dir (run_uids.dir): a test suite's, say, whose
// ranges no service of the host uses.
const DefaultDir = "/run/agentrun/uids"

// MaxID is the highest id a range may hold: (uid_t)-1 means "no change"
// to chown and setresuid.
const MaxID = 1<<32 - 2

// Check reports whether first and count make a usable range: at least one
// id, none below 65536 (root, system and regular users, nobody), none past
// MaxID.
func Check(first, count int64) error {
	switch {
	case count < 1:
		return errors.New("count must be at least 1")
	case first < 65536:
		return fmt.Errorf("first %d is below 65536: the range would overlap the host's own users (root, regular users, nobody)", first)
	case first > MaxID || count > MaxID || first+count-1 > MaxID:
		return fmt.Errorf("range %d+%d ends past %d", first, count, uint64(MaxID))
	}
	return nil
}
