//go:build linux && amd64

#include "textflag.h"

// func int80(nr, a1, a2, a3 uintptr) (r uintptr)
// An i386 system call through the legacy int $0x80 gate: number in AX,
// arguments in BX, CX, DX; the result comes back in AX.
TEXT ·int80(SB), NOSPLIT, $0-40
	MOVQ nr+0(FP), AX
	MOVQ a1+8(FP), BX
	MOVQ a2+16(FP), CX
	MOVQ a3+24(FP), DX
	INT  $0x80
	MOVQ AX, r+32(FP)
	RET
