#!/usr/bin/env bash
# KataGo's switches on 7x7 Go at one fixed wall-clock budget each (issue 26's ablation table).
#
#   bash benchmarks/go_ablation.sh [MINUTES] [OUT]        # defaults: 10, runs/zero/ablation
#
# Every arm is configs/zero/go7.yaml (compute_dtype auto, 2 threads) trained from scratch for
# MINUTES of wall clock (train.max_minutes: the run stops after the iteration that passes it,
# so each arm's games and minutes are printed beside its score), one seed each; then every arm's
# final network plays the base arm's final network, 100 games at 64 simulations each side,
# colours alternating, 2 random opening plies shared by each pair of games. The table goes to
# OUT/table.md. Run it alone on the machine: the arms share a clock, not a game count, so a
# busy machine shortchanges whichever arm it overlaps.
set -euo pipefail
MINUTES=${1:-10}
OUT=${2:-runs/zero/ablation}
RLSCALE=${RLSCALE:-rlscale}
mkdir -p "$OUT"

declare -A ARMS=(
  [base]=""
  [ownership]="network.ownership_head=true"
  [ownership_score]="network.ownership_head=true network.score_head=true"
  [global_pooling]="network.global_pooling=true"
  [playout_cap]="selfplay.fast_simulations=8 selfplay.full_search_prob=0.25"
)
ORDER=(base ownership ownership_score global_pooling playout_cap)

for arm in "${ORDER[@]}"; do
  if [ ! -d "$OUT/$arm/final" ]; then
    # shellcheck disable=SC2086  # the overrides are words
    $RLSCALE zero train configs/zero/go7.yaml --out "$OUT/$arm" --no-progress \
      train.max_minutes="$MINUTES" train.threads=2 checkpoint.every=1 ${ARMS[$arm]}
  fi
done

for arm in "${ORDER[@]:1}"; do
  [ -f "$OUT/$arm/vs_base.json" ] || $RLSCALE zero arena --game go --model "$OUT/$arm/final" \
    --opponent "model:$OUT/base/final" --simulations 64 --games 100 --opening-plies 2 \
    --threads 2 --json > "$OUT/$arm/vs_base.json"
done

for arm in "${ORDER[@]}"; do echo "$arm=${ARMS[$arm]}"; done > "$OUT/arms.txt"
python - "$OUT" <<'PY'
"""The table: each arm's budget as spent, and its match against the base arm."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = ["| arm | overrides | iterations | self-play games | learner steps | minutes | "
        "W / D / L vs base | score | Elo vs base (95% CI) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
for line in (out / "arms.txt").read_text().splitlines():
    arm, overrides = line.split("=", 1)
    metrics = (out / arm / "metrics.jsonl").read_text().splitlines()
    last = json.loads(metrics[-1])
    match = out / arm / "vs_base.json"
    if match.exists():
        r = json.loads(match.read_text())
        cells = f"{r['wins']} / {r['draws']} / {r['losses']} | {r['score']:.0%} | {r['elo']['text']}"
    else:
        cells = "(the anchor) | | "
    rows.append(f"| {arm} | `{overrides or 'go7.yaml as is'}` | {len(metrics)} | "
                f"{last['counters/games']:,} | {last['counters/learner_steps']:,} | "
                f"{last['counters/seconds'] / 60:.1f} | {cells} |")
(out / "table.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
