#!/usr/bin/env bash
# initcost.sh BEFORE AFTER [N]: what a change of agentrun's imports costs
# every container: the binary re-executes itself as each container's init,
# and every package's init runs again there. For two agentrun binaries it
# prints, as medians of N runs (default 200), interleaved:
#   - the time of all package inits (GODEBUG=inittrace=1, `agentrun help`),
#     and of the inits of the packages only AFTER has;
#   - the wall time of a cold `agentrun run` of print(45) on the python
#     test image (N/5 runs each; root).
set -euo pipefail
before=$1 after=$2 n=${3:-200}
images=${AGENTRUN_IMAGES:-/var/cache/agentrun/images}

inits() { GODEBUG=inittrace=1 "$1" help 2>&1 >/dev/null | awk '$1 == "init" {print $2, $5}'; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }

new=$(comm -13 <(inits "$before" | cut -d' ' -f1 | sort -u) <(inits "$after" | cut -d' ' -f1 | sort -u) | tr '\n' ' ')
tb=() ta=() tn=()
for _ in $(seq "$n"); do
	tb+=("$(inits "$before" | awk '{s+=$2} END {print s}')")
	out=$(inits "$after")
	ta+=("$(awk '{s+=$2} END {print s}' <<<"$out")")
	tn+=("$(awk -v new=" $new" 'index(new, " " $1 " ") {s+=$2} END {print s+0}' <<<"$out")")
done
echo "packages only in $after: ${new:-none}"
echo "all inits, median of $n: before $(printf '%s\n' "${tb[@]}" | median) ms, after $(printf '%s\n' "${ta[@]}" | median) ms"
echo "inits of those packages, median of $n: $(printf '%s\n' "${tn[@]}" | median) ms"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '{"image": "dir:%s/python/rootfs", "audit": "", "state_dir": "%s/state"}\n' "$images" "$work" >"$work/config.json"
echo '{"code": "print(45)"}' >"$work/task.json"
cold() {
	local t0 t1
	t0=$(date +%s%N)
	"$1" run --config "$work/config.json" "$work/task.json" >/dev/null
	t1=$(date +%s%N)
	awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f\n", (b - a) / 1e6}'
}
cb=() ca=()
for _ in $(seq $((n / 5))); do
	cb+=("$(cold "$before")")
	ca+=("$(cold "$after")")
done
echo "cold agentrun run, median of $((n / 5)): before $(printf '%s\n' "${cb[@]}" | median) ms, after $(printf '%s\n' "${ca[@]}" | median) ms"
