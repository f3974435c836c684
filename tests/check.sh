# Sourced by the shell tests: `check NAME COMMAND...` counts COMMAND's success or failure (printing the
# failed NAME), and `summary [LABEL]` prints the counts and returns non-zero when a check failed.
pass=0 fail=0
check() {  # check NAME CONDITION-COMMAND...
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $name"; fi
}
summary() {
  echo "${1:+$1: }$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
