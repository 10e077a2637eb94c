#!/usr/bin/env bash
# Builds compared on one development row in one device call: each variant's `msa` (under
# .gpu-bundle/var/, packed by scripts/build-variants.sh) times ROW_CASES, ROW_ROUNDS rounds, the
# order reversed every other round; a build whose call passes ROW_LIMIT seconds (a hang) is
# listed as dead and not timed again. Then the mean of the rounds per stage line and its ratio to
# the first build.
#   ROW_NAMES="base A B" ROW_CASES=434:0 bash scripts/device/row-ab.sh
# (ROW_PATTERN recent16,random and ROW_STAGES forward by default, ROW_ITERS 30, ROW_ROUNDS 4,
# ROW_LIMIT 25.) Logs and JSON in $OUT/g/; the dead builds in $OUT/g/dead. With ROW_PICK="A B",
# $OUT/g/pick names the one of those (alive) with the highest mean on the first stage line, if it
# reaches ROW_MIN (default 1.003) times the first build's, and is empty otherwise: a command gates
# its correctness jobs on it. ROW_PICK_BY=prepare (with ROW_STAGES=prepare,forward) picks the one
# with the lowest mean prepare instead, if it is ROW_MIN_US (default 0.3) microseconds under the
# first build's; the prepare means and their share of the forward are printed either way.
set -uo pipefail
bash scripts/device/unpack-variants.sh || exit 1
G="$OUT/g"; mkdir -p "$G"
names="${ROW_NAMES:-base A B}"; rev="$(echo $names | tr ' ' '\n' | tac | tr '\n' ' ')"; dead=""
for round in $(seq 1 "${ROW_ROUNDS:-4}"); do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    case " $dead " in *" $v "*) continue;; esac
    (cd ".gpu-bundle/var/$v" && timeout "${ROW_LIMIT:-25}" ./msa bench --cases "${ROW_CASES:-434:0}" \
       --pattern "${ROW_PATTERN:-recent16,random}" --stages "${ROW_STAGES:-forward}" --warmup 2 \
       --iters "${ROW_ITERS:-30}" --json "$G/$v-$round.jsonl" > "$G/$v-$round.log" 2>&1) \
      || { echo "$v $round failed or hung"; dead="$dead $v"; }
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  [a-z_0-9]+ +[0-9.]+ ' "$G/$v-$round.log" | awk '{print $1, $5}' | tr '\n' ' ')"
  done
done
echo "$dead" > "$G/dead"
ROW_PICK="${ROW_PICK:-}" ROW_MIN="${ROW_MIN:-1.003}" ROW_PICK_BY="${ROW_PICK_BY:-}" ROW_MIN_US="${ROW_MIN_US:-0.3}" \
  python3 - "$G" $names <<'PY'
import json, os, re, statistics, sys
g, names = sys.argv[1], sys.argv[2:]
means = {}
for v in names:
    rows = {}
    for r in range(1, 100):
        try:
            lines = open(f"{g}/{v}-{r}.log").read().splitlines()
        except FileNotFoundError:
            break
        timed = [x for x in lines if re.match(r"^  [a-z_0-9]+ +[0-9.]+ ", x) and len(x.split()) == 5]
        for i, l in enumerate(timed):
            rows.setdefault(i, []).append(float(l.split()[4]))
    means[v] = [statistics.mean(x) for _, x in sorted(rows.items())]
base = means[names[0]]
for v in names:
    m = means[v]
    ratio = " ".join(f"{a / b:.3f}" for a, b in zip(m, base)) if m and base else "-"
    print(f"{v:>8} mean TFLOP/s {' '.join(f'{x:.1f}' for x in m) or '-'}  x {names[0]} {ratio}")
# With the prepare stage timed (ROW_STAGES=prepare,forward): its mean median in microseconds and
# its share of the forward's, per build, from the JSON (the log rounds it to 1 us).
prep = {}
for v in names:
    p, f = [], []
    for r in range(1, 100):
        try:
            recs = [json.loads(x) for x in open(f"{g}/{v}-{r}.jsonl")]
        except FileNotFoundError:
            break
        for d in recs:
            st = {s["stage"]: s["median_ms"] for s in d.get("stages", [])} if d.get("record") == "case" else {}
            if "prepare" in st and "forward" in st:
                p.append(st["prepare"] * 1e3)
                f.append(st["forward"] * 1e3)
    if p:
        prep[v] = statistics.mean(p)
        print(f"{v:>8} prepare {prep[v]:.2f} us, {100 * prep[v] / statistics.mean(f):.2f}% of the forward")
if os.environ["ROW_PICK"]:
    dead = open(f"{g}/dead").read().split()
    alive = [v for v in os.environ["ROW_PICK"].split() if v not in dead]
    if os.environ["ROW_PICK_BY"] == "prepare":
        # The fastest prepare, if ROW_MIN_US under the first build's.
        best = min((v for v in alive if v in prep), key=prep.get, default="")
        ok = best and names[0] in prep and prep[best] <= prep[names[0]] - float(os.environ["ROW_MIN_US"])
    else:
        first = lambda v: means[v][0] if means.get(v) else 0.0
        best = max(alive, key=first, default="")
        ok = best and base and first(best) >= float(os.environ["ROW_MIN"]) * base[0]
    open(f"{g}/pick", "w").write(best if ok else "")
    print(f"pick: {best if ok else '(none)'}")
PY
