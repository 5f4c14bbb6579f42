//go:build linux && amd64

package main

// int80 makes an i386 system call through int $0x80 (int80_amd64.s).
func int80(nr, a1, a2, a3 uintptr) (r uintptr)
