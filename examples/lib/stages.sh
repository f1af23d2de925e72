# The stage runner of the example pipelines (sourced by examples/*/run.sh): a stage whose output exists
# is skipped, so an interrupted run continues where it stopped; each stage's output goes to
# $OUT/logs/<stage>.log and its wall time and peak RSS to $OUT/logs/<stage>.time (GNU time -v, when
# installed). Reads the caller's OUT, ONLY (run only these stages) and UNTIL (stop after this stage).

stage() {  # stage NAME DONE_FILE CMD...: run CMD unless DONE_FILE exists; time it
  local name="$1" done_file="$2"
  shift 2
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  if [ -e "$done_file" ]; then
    echo "== $name: done ($done_file)"
    if [ "$name" = "$UNTIL" ]; then exit 0; fi
    return
  fi
  echo "== $name: $*"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -v -o "$OUT/logs/$name.time" "$@" 2>&1 | tee "$OUT/logs/$name.log"
  else
    "$@" 2>&1 | tee "$OUT/logs/$name.log"
  fi
  if [ "$name" = "$UNTIL" ]; then echo "== stopping after $name (UNTIL)"; exit 0; fi
}
