#!/bin/bash
# The similarity study on a lent GPU machine, in pieces that accumulate across machines (docs/gpu.md,
# "The similarity study on a GPU").
#
# Usage, on the device machine, from the repository root:
#   experiments/device_study.sh CONFIG RUN [SECONDS]     # e.g. paper paper 520
# Before, here: copy what the study reads of the zoo, data packed in (python -c "from funsim.models.zoo import
# carry_zoo; carry_zoo('TRAINED/zoo/ZOO', 'results/zoo/ZOO')") and carry results/zoo/ZOO (and
# results/similarity_study/RUN, to resume).
# It runs `funsim similarity-study --config CONFIG --run RUN` for at most SECONDS (default 520) with the
# results in $OUT; the study writes every finished unit (a model pair's grid, a stitching target) atomically,
# so a run cut off by the limit loses only the unit in progress. At the end the run folder is packed into
# $OUT/units.tar.gz (split into 15 MiB parts, units.tar.gz.00, .01, ..., when larger) and the log is $OUT/study.log.
# After, here: cat FILES_AT/units.tar.gz* | tar -xz -C /tmp/device, then
#   funsim similarity-study --config CONFIG --run RUN --merge-units /tmp/device/RUN
# (refused if the units were computed with another config or code version), and rerun the study, here or on
# the next device run, which computes only the missing units.
# Settings: PYTHON (default python3); STUDY_RESULTS (default results/ of this tree). It imports funsim from this tree through a folder of links; no network.
set -u
CFG=${1:?usage: experiments/device_study.sh CONFIG RUN [SECONDS]}
RUN=${2:?usage: experiments/device_study.sh CONFIG RUN [SECONDS]}
SECS=${3:-520}
OUT=${OUT:?set OUT: the folder that comes back}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
RESULTS=${STUDY_RESULTS:-$ROOT/results}
LINKS=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$LINKS" "$WORK"' EXIT
mkdir "$LINKS/funsim"
for d in similarity models experiments data runtime; do ln -s "$ROOT/$d" "$LINKS/funsim/$d"; done
export PYTHONPATH="$LINKS:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TFDS_DISABLE_DOWNLOAD=1
mkdir -p "$WORK/similarity_study" "$OUT" || exit 2
ln -s "$RESULTS/zoo" "$WORK/zoo"
[ -d "$RESULTS/similarity_study/$RUN" ] && cp -r "$RESULTS/similarity_study/$RUN" "$WORK/similarity_study/"
timeout "$SECS" "$PY" -m funsim.experiments.cli similarity-study --config "$CFG" --run "$RUN" --root "$WORK" \
  --no-progress > "$OUT/study.log" 2>&1
status=$?
echo "device_study: the study exited with status $status (124: stopped at the $SECS s limit)" | tee -a "$OUT/study.log"
tar -C "$WORK/similarity_study" -czf "$WORK/units.tar.gz" "$RUN" || exit 2
if [ "$(stat -c %s "$WORK/units.tar.gz")" -gt 15728640 ]; then
  split -b 15M -d "$WORK/units.tar.gz" "$OUT/units.tar.gz."
else
  cp "$WORK/units.tar.gz" "$OUT/"
fi
ls -l "$OUT" | tee -a "$OUT/study.log"
exit $status
