package spec

import (
	"fmt"
	"math"
)

func sprint(v any) string { return fmt.Sprint(v) }
func nan() float64        { return math.NaN() }
