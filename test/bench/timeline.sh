#!/bin/sh
# timeline.sh [N]: where a cold run's wall time goes, step by step, against
# runc's CLI on the same spec (the bench's bundle). Records the kernel's
# process events (exec, fork, exit: no sampling, so the runs are barely
# slowed) of N cold `agentrun run`s of print(45) and N `runc run`s,
# interleaved, and prints the median time of each step from the CLI's
# exec (docs/bench.md, "A cold run's wall time").
#
#   test/bench/timeline.sh [N]    (root; perf from linux-perf; runc)
#
# AGENTRUN_BIN is the binary (default bin/agentrun; its agentrun-seccomp
# beside it), AGENTRUN_IMAGES the test images.
set -eu
n=${1:-20}
command -v perf >/dev/null || { echo "timeline.sh: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
GO=${GO:-go}
bin=$(realpath "${AGENTRUN_BIN:-bin/agentrun}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$GO build -tags seccomp,runc_nocriu -o "$tmp/bench" ./test/bench
# The bench writes its config, task and runc bundle, measures one run of
# each and keeps them.
work=$("$tmp/bench" -agentrun "$bin" -cold-only -n 1 -keep-work 2>&1 >/dev/null | sed -n 's/^work dir kept: //p')
[ -d "$work" ] || { echo "timeline.sh: the bench kept no work dir" >&2; exit 1; }
trap 'rm -rf "$tmp" "$work"' EXIT
# The bench's copy of the binary, as an installed binary is (main.go's
# installCopy): the loop runs it, and the events name it.
bin=$(ls "$work"/bin-*/agentrun | head -n 1)
cat >"$tmp/loop.sh" <<LOOP
for i in \$(seq $n); do
	"$bin" run --config "$work/config.json" "$work/task.json" >/dev/null
	runc --root "$work/runc-state" run --bundle "$work/bundle" "timeline-\$i" >/dev/null
done
LOOP
perf record -q -a -k CLOCK_MONOTONIC -o "$tmp/perf.data" \
	-e sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit -- sh "$tmp/loop.sh"
perf script -i "$tmp/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null >"$tmp/events.txt"
"$tmp/bench" -agentrun "$bin" -timeline "$tmp/events.txt"
