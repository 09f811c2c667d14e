#!/usr/bin/env bash
# Instructions per request for an L1 hit and for the bare inner service,
# counted by callgrind (see benches/hit_cost.rs). Needs valgrind. Where
# redis-server is installed, also a Redis hit with L1 off against a private
# redis-server on a free loopback port (ONLY=redis: those two paths alone).
# Usage: bash benches/hit_cost.sh [requests]   (default 2000, a multiple of 40)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
bin=${HIT_COST_BIN:-$(cargo bench --bench hit_cost --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)}
[ -x "$bin" ] || { echo "could not build the hit_cost bench" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # path requests [function] -> instructions collected inside `measure` (or function)
    # The batched paths name their function exactly: a pattern would also
    # match drop glue of its own futures, and each match toggles collection.
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" --toggle-collect="${3:-*hit_cost*measure*}" \
        "$bin" "$1" "$2" 2>"$out/log" >/dev/null || { cat "$out/log" >&2; exit 1; }
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/cg"
}
per() { # path [function] -> instructions per request, set-up cancelled out
    local a b
    a=$(count "$1" "$n" "${2:-}")
    b=$(count "$1" $((2 * n)) "${2:-}")
    echo $(((b - a) / n))
}
printf '%-12s %14s\n' path instr/request
declare -A got
if [ "${ONLY:-}" != redis ]; then
    for p in bare hit bare-axum hit-axum; do
        got[$p]=$(per "$p")
        printf '%-12s %14s\n' "$p" "${got[$p]}"
    done
    awk -v h="${got[hit]}" -v b="${got[bare]}" -v ha="${got[hit-axum]}" -v ba="${got[bare-axum]}" \
        'BEGIN { printf "L1 hit / bare service_fn: %.2fx\nL1 hit / bare axum Router: %.2fx\n", h / b, ha / ba }'
fi
command -v redis-server >/dev/null || { echo "redis-server not installed: Redis rows skipped"; exit 0; }
for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 20000))
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --pidfile "$out/redis.pid" --logfile "$out/redis.log" >/dev/null 2>&1 || continue
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
done
trap 'kill "$(cat "$out/redis.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$out"' EXIT
export HERDGUARD_BENCH_REDIS="redis://127.0.0.1:$port/"
for p in bare-axum-rt redis-axum; do
    got[$p]=$(per "$p" hit_cost::measure_batched)
    printf '%-12s %14s\n' "$p" "${got[$p]}"
done
awk -v r="${got[redis-axum]}" -v b="${got[bare-axum-rt]}" \
    'BEGIN { printf "Redis hit, L1 off / bare axum Router (batches of 40): %.2fx\n", r / b }'
