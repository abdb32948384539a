#!/bin/bash
# The smoke zoo + smoke similarity study on 1 vs 2 local processes (benchmarks/RESULTS.md).
# Usage: benchmarks/multiprocess_study.sh [ROUNDS]   (from the repository root, after `make venv`)
# Each round runs N = 1 then N = 2 (alternating), each into a fresh results folder, with the
# persistent compilation cache off (every run compiles from scratch). Prints
# round|N|command|rc|wall user sys (s, user and sys summed over the launcher and its processes)|load average.
# On a 2-core machine this measures correctness and overhead, not a speed-up.
set -u
FUNSIM="$(pwd)/.venv/bin/funsim"
WORK=$(mktemp -d)
cd "$WORK" || exit 1
for r in $(seq 1 "${1:-1}"); do
  for n in 1 2; do
    rm -rf "$WORK/results"
    for cmd in "zoo --config smoke" "similarity-study --config smoke"; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      /usr/bin/time -f "%e %U %S" -o "$WORK/time" env FUNSIM_COMPILE_CACHE=off \
        $FUNSIM launch -n "$n" $cmd --no-progress >"$WORK/out" 2>&1
      echo "$r|$n|$cmd|rc=$?|$(tail -1 "$WORK/time")|load $load"
    done
    if [ "$n" = 2 ]; then cp "$WORK/results/similarity_study/smoke/comparisons.csv" "$WORK/two.csv"; fi
    if [ "$n" = 1 ]; then cp "$WORK/results/similarity_study/smoke/comparisons.csv" "$WORK/one.csv"; fi
  done
  if cmp -s "$WORK/one.csv" "$WORK/two.csv"; then echo "$r|comparisons.csv identical (1 vs 2 processes)"
  else echo "$r|comparisons.csv DIFFERS (1 vs 2 processes)"; fi
done
rm -rf "$WORK"
