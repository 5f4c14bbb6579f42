package jsonkeys_test

import (
	"fmt"

	"github.com/agentrun/agentrun/internal/jsonkeys"
)

func ExampleCheck() {
	fmt.Println(jsonkeys.Check([]byte(`{"to": "alice", "cc": ["bob"]}`)))
	fmt.Println(jsonkeys.Check([]byte(`{"to": "alice", "body": "hi", "to": "mallory"}`)))
	fmt.Println(jsonkeys.Check([]byte(`{"msg": {"to": "alice", "TO": "mallory"}}`)))
	// Output:
	// <nil>
	// key /to appears twice in its object
	// key /msg/TO appears twice in its object, in other letter case (a reader may take them for one key)
}
