#!/bin/sh
# profile.sh: where the CPU goes while agentrun serve is busy. Records
# every CPU (perf record -a -g) while the load section of the bench drives
# one serve subject, and folds the stacks (one line per stack, outermost
# frame first, then the sample count: the input of flamegraph.pl or
# speedscope).
#
#   test/bench/profile.sh SUBJECT K OUT    (root; perf from linux-perf)
#
# SUBJECT picks the load subjects whose names contain it ("no pool",
# "pool of 4"); K is the concurrency. OUT.folded gets every stack, OUT.txt
# a summary: the share of samples per command and per top frame of
# agentrun's own code and of the kernel.
set -eu
subject=$1 k=$2 out=$3
command -v perf >/dev/null || { echo "profile.sh: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$GO build -tags seccomp -o "$tmp/bench" ./test/bench
# The floor runs too (the bench always measures it): its samples are
# those of chroot and of python3 outside any sandbox.
perf record -q -a -g -F 499 -o "$tmp/perf.data" -- \
	"$tmp/bench" -agentrun "${AGENTRUN_BIN:-bin/agentrun}" -load-only -load-filter "$subject" -load-k "$k" -load-rounds 1 -load-runs "${RUNS:-60}" >"$tmp/load.md" 2>&1 || true
# Only the span where serve is measured would be better; the bench prints
# which subject ran when, the profile covers all of it (bare included).
# A container's init runs agentrun from a sealed copy that perf cannot
# open ("/agentrun" in a detached overlay mount): the bench's -fold-perf
# names those frames from the binary's own symbols as it folds.
perf script -i "$tmp/perf.data" 2>/dev/null >"$tmp/script.txt"
"$tmp/bench" -agentrun "${AGENTRUN_BIN:-bin/agentrun}" -fold-perf "$tmp/script.txt" >"$out.folded"
total=$(awk '{ t += $NF } END { print t }' "$out.folded")
{
	echo "# perf record -a -g -F 499, load subject \"$subject\" (and the floor), concurrency $k"
	echo "# samples: $total; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	echo "## by command"
	awk -v t="$total" '{ split($1, f, ";"); c[f[1]] += $NF } END { for (k in c) printf "%6.2f%%  %s\n", 100 * c[k] / t, k }' "$out.folded" | sort -nr | head -20
	echo
	echo "## by function, inclusive (every frame of a stack counted once)"
	awk -v t="$total" '{
		n = split($1, f, ";"); delete seen
		for (i = 2; i <= n; i++) if (!(f[i] in seen)) { seen[f[i]] = 1; c[f[i]] += $NF }
	} END { for (k in c) printf "%6.2f%%  %s\n", 100 * c[k] / t, k }' "$out.folded" | sort -nr | head -80
	echo
	echo "## by function, self (the innermost frame)"
	awk -v t="$total" '{ n = split($1, f, ";"); c[f[n]] += $NF } END { for (k in c) printf "%6.2f%%  %s\n", 100 * c[k] / t, k }' "$out.folded" | sort -nr | head -40
	echo
	echo "## the load section of that run"
	cat "$tmp/load.md"
} >"$out.txt"
