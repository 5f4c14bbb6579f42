package main

import (
	"strings"
	"testing"
)

// A cold run of each, as perf script prints their events (abridged).
const timelineSample = `
            agentrun  100/100   1000.000000: sched:sched_process_exec: filename=/opt/agentrun pid=100 old_pid=100
            agentrun  100/100   1000.006000: sched:sched_process_fork: comm=agentrun pid=100 child_comm=agentrun child_pid=101
                   7  102/102   1000.028000: sched:sched_process_exec: filename=/proc/self/fd/7 pid=102 old_pid=102
     runc:[0:PARENT]  102/102   1000.035000: sched:sched_process_fork: comm=runc:[0:PARENT] pid=102 child_comm=runc:[0:PARENT] child_pid=103
     runc:[0:PARENT]  102/102   1000.041000: sched:sched_process_exit: comm=runc:[0:PARENT] pid=102 prio=120 group_dead=true
       runc:[2:INIT]  104/104   1000.047000: sched:sched_process_fork: comm=runc:[2:INIT] pid=104 child_comm=runc:[2:INIT] child_pid=105
     agentrun-seccom  104/104   1000.078000: sched:sched_process_exec: filename=/dev/agentrun-seccomp pid=104 old_pid=104
                init  104/104   1000.080000: sched:sched_process_exec: filename=/dev/init pid=104 old_pid=104
             python3  106/106   1000.084000: sched:sched_process_exec: filename=/usr/bin/python3 pid=106 old_pid=106
             python3  106/106   1000.110000: sched:sched_process_exit: comm=python3 pid=106 prio=120 group_dead=true
                init  104/104   1000.111000: sched:sched_process_exit: comm=init pid=104 prio=120 group_dead=true
            agentrun  100/101   1000.116000: sched:sched_process_exit: comm=agentrun pid=100 prio=120 group_dead=false
            agentrun  100/100   1000.117000: sched:sched_process_exit: comm=agentrun pid=100 prio=120 group_dead=true
                runc  200/200   1001.000000: sched:sched_process_exec: filename=/usr/sbin/runc pid=200 old_pid=200
                 exe  201/201   1001.029000: sched:sched_process_exec: filename=/proc/self/exe pid=201 old_pid=201
                runc  201/201   1001.035000: sched:sched_process_exec: filename=/dev/fd/6 pid=201 old_pid=201
                init  204/204   1001.079000: sched:sched_process_exec: filename=/dev/init pid=204 old_pid=204
                init  204/204   1001.110000: sched:sched_process_exit: comm=init pid=204 prio=120 group_dead=true
                runc  200/200   1001.112000: sched:sched_process_exit: comm=runc pid=200 prio=120 group_dead=true
`

func TestTimelineSteps(t *testing.T) {
	events, err := parseProcEvents(strings.NewReader(timelineSample))
	if err != nil {
		t.Fatal(err)
	}
	runs := coldRuns(events, "/opt/agentrun")
	if len(runs) != 2 || runs[0].runc || !runs[1].runc {
		t.Fatalf("runs = %+v; want agentrun's then runc's", runs)
	}
	want := map[string]float64{coldRunSteps[0]: 6, coldRunSteps[1]: 28, coldRunSteps[2]: 35, coldRunSteps[3]: 41,
		coldRunSteps[4]: 47, coldRunSteps[5]: 78, coldRunSteps[6]: 80, coldRunSteps[7]: 84, coldRunSteps[8]: 110,
		coldRunSteps[9]: 111, coldRunSteps[10]: 117}
	for step, ms := range want {
		if got := runs[0].steps[step]; got < ms-0.01 || got > ms+0.01 {
			t.Errorf("agentrun %q = %.3f ms; want %.0f", step, got, ms)
		}
	}
	// runc's own exec of /proc/self/exe is not the init's: its memfd's is.
	if got := runs[1].steps[coldRunSteps[1]]; got < 34.99 || got > 35.01 {
		t.Errorf("runc's init executed at %.3f ms; want 35 (its memfd copy's exec)", got)
	}
	if got := runs[1].steps[coldRunSteps[10]]; got < 111.99 || got > 112.01 {
		t.Errorf("runc exited at %.3f ms; want 112", got)
	}
	var b strings.Builder
	timelineReport(&b, runs)
	if !strings.Contains(b.String(), "| the CLI exited | 117.0 (+6.0) | 112.0 (+2.0) |") {
		t.Errorf("report:\n%s", b.String())
	}
}
