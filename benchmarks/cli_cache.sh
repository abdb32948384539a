#!/bin/bash
# Cold vs warm runs of the CLI with the persistent compilation cache (benchmarks/RESULTS.md).
# Usage: benchmarks/cli_cache.sh [ROUNDS]   (from the repository root, after `make venv`)
# Each round, per command: cache off, first run into a fresh cache directory, second run.
# Prints round|command|mode|rc|wall user sys (s)|load average. Runs in a scratch directory.
set -u
FUNSIM="$(pwd)/.venv/bin/funsim"
WORK=$(mktemp -d)
cd "$WORK" || exit 1
for r in $(seq 1 "${1:-3}"); do
  for cmd in "quickstart --tiny" "compare --example"; do
    cache="$WORK/cache_${r}_$(echo "$cmd" | tr ' -' '__')"
    for mode in off cold warm; do
      rm -rf "$WORK/results"
      if [ "$mode" = off ]; then setting=off; else setting="$cache"; fi
      load=$(cut -d' ' -f1 /proc/loadavg)
      /usr/bin/time -f "%e %U %S" -o "$WORK/time" env FUNSIM_COMPILE_CACHE="$setting" $FUNSIM $cmd >/dev/null 2>"$WORK/err"
      echo "$r|$cmd|$mode|rc=$?|$(tail -1 "$WORK/time")|load $load|stderr lines $(wc -l <"$WORK/err")"
    done
  done
done
rm -rf "$WORK"
