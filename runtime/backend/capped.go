package backend

import "bytes"

// CappedBuffer keeps the first Max bytes written to it and drops the rest,
// so that a command's output costs at most Max bytes of memory while the
// command still writes to the end.
type CappedBuffer struct {
	bytes.Buffer
	Max int
}

func (c *CappedBuffer) Write(b []byte) (int, error) {
	if room := c.Max - c.Len(); room > 0 {
		c.Buffer.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}
