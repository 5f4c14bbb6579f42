package sandbox

import (
	"context"
	"errors"
	"testing"
)

// A sandbox lists at most maxProcesses processes once some ended: the
// oldest ended go first, a running one is never dropped.
func TestProcessListBound(t *testing.T) {
	s := &Sandbox{}
	running := newProcess([]string{"sleep"}, 10)
	s.procs = append(s.procs, running)
	for range 3 * maxProcesses {
		p := newProcess([]string{"true"}, 10)
		code := 0
		p.exit = &Event{Event: "exit", ExitCode: &code}
		s.procs = append(s.procs, p)
		s.trimLocked()
	}
	if len(s.procs) > maxProcesses {
		t.Errorf("%d processes listed, past the bound of %d", len(s.procs), maxProcesses)
	}
	if s.procs[0] != running {
		t.Error("the running process was dropped from the list")
	}
	if len(s.Processes()) != len(s.procs) {
		t.Error("Processes lists what the sandbox does not keep")
	}
}

// A sandbox's ports take at most MaxPortConns connections at once: one
// more is refused, before anything is dialled, naming the bound.
func TestPortConnsBound(t *testing.T) {
	s := &Sandbox{}
	s.ports.conns = map[*portConn]struct{}{}
	for range MaxPortConns {
		s.ports.conns[&portConn{p: &s.ports}] = struct{}{}
	}
	// s has no live sandbox behind it: a dial would panic.
	if _, err := s.DialPort(context.Background(), 8000); !errors.Is(err, ErrPortConns) {
		t.Errorf("a connection past %d open: %v", MaxPortConns, err)
	}
}

// The output a sandbox keeps of its ended processes is bounded all
// together: past maxEndedOutput the oldest ended go, the newest and the
// running stay.
func TestEndedOutputBound(t *testing.T) {
	const each = 1 << 20
	s := &Sandbox{}
	running := newProcess([]string{"yes"}, each)
	running.output("stdout", make([]byte, each))
	s.procs = append(s.procs, running)
	var last *Process
	for range 3 * maxEndedOutput / each {
		p := newProcess([]string{"head"}, each)
		p.output("stdout", make([]byte, each))
		code := 0
		p.exit = &Event{Event: "exit", ExitCode: &code}
		s.procs = append(s.procs, p)
		s.noteEnded(p)
		last = p
	}
	var kept int64
	for _, p := range s.procs {
		kept += p.endedOutput()
	}
	if kept > maxEndedOutput || kept < maxEndedOutput-each {
		t.Errorf("ended processes keep %d bytes; want at most %d, and no fewer than one less", kept, maxEndedOutput)
	}
	if s.procs[0] != running || s.procs[len(s.procs)-1] != last {
		t.Error("the running process or the newest ended one was dropped")
	}
}
