package config

import (
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	ok := []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"1", 1}, {"65536", 65536}, {"1b", 1}, {"1B", 1},
		{"1k", 1 << 10}, {"1K", 1 << 10}, {"1kb", 1 << 10}, {"1KB", 1 << 10}, {"1Ki", 1 << 10}, {"1KiB", 1 << 10},
		{"256m", 256 << 20}, {"256M", 256 << 20}, {"64MiB", 64 << 20}, {"64mb", 64 << 20},
		{"2g", 2 << 30}, {"1GiB", 1 << 30}, {"1t", 1 << 40}, {"1TB", 1 << 40},
		{"1.5k", 1536}, {"0.5g", 512 << 20}, {"007m", 7 << 20},
		{"9223372036854775807", 1<<63 - 1}, {"8388607t", 8388607 << 40},
	}
	for _, tc := range ok {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	bad := []string{
		"", "-1", "-1m", "abc", "m", "1x", "1 m", " 1m", "1m ", "1.5", "1.", ".5", "1..2", "1.2.3",
		"1e3", "1/2", "+1", "0x10", "1mm", "1kib2", "1p", "9223372036854775808", "8388608t", "1.0000001k",
		"11111111111111111111111111111111111111111111111111111111111111111111",
	}
	for _, in := range bad {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, got)
		}
	}
}

func TestParseDuration(t *testing.T) {
	ok := map[string]time.Duration{"5s": 5 * time.Second, "1m30s": 90 * time.Second, "250ms": 250 * time.Millisecond, "1h": time.Hour}
	for in, want := range ok {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0s", "-1s", "5", "abc", "5 s", "1y"} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want error", in, got)
		}
	}
}
