# One row of target/cluster/matrix.md from a scenario's answers (scripts/cluster/matrix.sh).
# Input lines: start time, image kind (signed|unsigned), HTTP status, seconds, message.
# Variables: name, t0 and t1 (the fault's start and end), late (seconds); with list=1, the
# answers that were not right instead, the first of each kind.
function denied(code, msg) { return (code == 400 || code == 403) && msg ~ /denied the request/ }
# ivory's own answer when it could not judge (failurePolicy Fail), or the API server's when it
# could not reach ivory.
function unjudged(msg) {
  return msg ~ /failed calling webhook|Internal error occurred: .*webhook/ ||
    msg ~ /budget|deadline|timed out|timeout|could not (be )?(judge|reach|resolve)|unreachable|connection refused/
}
function bad(t, what) {
  if (t > t0 && t - t0 > recovered) recovered = t - t0
  any_bad = 1
  if (list) {
    key = what " " $2 " " $3 " " substr($5, 1, 100)
    if (!(key in seen)) { seen[key] = 1; printf "* %s: %s, %s image, HTTP %s after %.1f s: `%s`\n", name, what, $2, $3, $4, substr($5, 1, 300) }
  }
}
{
  n++
  end = $1 + $4
  if ($3 == "000" || ($3 >= 500 && $5 !~ /webhook/)) { apidown++; bad(end, "API down"); next }
  lat[++answered] = $4 + 0
  if ($4 + 0 > late) { lates++; bad(end, "late") }
  if ($2 == "signed") {
    if ($3 == 201) { admitted++; next }
    if (unjudged($5)) { failed++; bad(end, "failed") } else { wrong++; bad(end, "WRONG") }
    next
  }
  if ($3 == 201) { wrong++; bad(end, "WRONG"); next }
  if (denied($3, $5) && !unjudged($5)) { refused++; next }
  failed++; bad(end, "failed")
}
function pct(p,   i) { i = int(p * answered + 0.999); if (i < 1) i = 1; return lat[i] }
END {
  if (list) exit
  if (answered > 0) asort(lat)
  lats = answered > 0 ? sprintf("%.3f / %.3f / %.3f s", pct(0.5), pct(0.99), lat[answered]) : "—"
  rec = any_bad ? sprintf("%.1f s", recovered) : "—"
  printf "| %s | %.1f s | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n",
    name, t1 - t0, n, admitted, refused, failed, lates, wrong, apidown, lats, rec
}
