package uidrange_test

import (
	"fmt"

	"github.com/agentrun/agentrun/internal/uidrange"
)

func ExampleCheck() {
	fmt.Println(uidrange.Check(uidrange.DefaultFirst, uidrange.DefaultCount))
	fmt.Println(uidrange.Check(1000, 10))
	fmt.Println(uidrange.Check(uidrange.MaxID, 2))
	// Output:
	// <nil>
	// first 1000 is below 65536: the range would overlap the host's own users (root, regular users, nobody)
	// range 4294967294+2 ends past 4294967294
}
