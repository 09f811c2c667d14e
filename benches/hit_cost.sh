#!/usr/bin/env bash
# Instructions per request for an L1 hit and for the bare inner service,
# counted by callgrind (see benches/hit_cost.rs). Needs valgrind.
# Usage: bash benches/hit_cost.sh [requests]   (default 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
bin=$(cargo bench --bench hit_cost --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build the hit_cost bench" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # path requests -> instructions collected inside `measure`
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" --toggle-collect='*hit_cost*measure*' \
        "$bin" "$1" "$2" 2>"$out/log" >/dev/null || { cat "$out/log" >&2; exit 1; }
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/cg"
}
per() { # path -> instructions per request, set-up cancelled out
    local a b
    a=$(count "$1" "$n")
    b=$(count "$1" $((2 * n)))
    echo $(((b - a) / n))
}
printf '%-10s %14s\n' path instr/request
declare -A got
for p in bare hit bare-axum hit-axum; do
    got[$p]=$(per "$p")
    printf '%-10s %14s\n' "$p" "${got[$p]}"
done
awk -v h="${got[hit]}" -v b="${got[bare]}" -v ha="${got[hit-axum]}" -v ba="${got[bare-axum]}" \
    'BEGIN { printf "L1 hit / bare service_fn: %.2fx\nL1 hit / bare axum Router: %.2fx\n", h / b, ha / ba }'
