package proxy

import "errors"

// errHungUp is the cause of a context ended by untilHangup because the
// client went.
var errHungUp = errors.New("client hung up")
