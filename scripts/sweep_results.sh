#!/usr/bin/env bash
# sweep_results.sh: the results table of an L1 sweep (scripts/sweep_l1.sh).
# Reads DIR/lambda_*/log.jsonl and writes DIR/results.csv and DIR/results.md,
# one row per lambda in increasing order:
#   val CE       the last validation line, and its change against lambda = 0 in %
#   accuracy     the last multiple-choice evaluation line (--eval-file): acc_norm and acc, and
#                the examples scored; "-" for a run without one
#   L0           the last training step's mean number of firing FFN units per token
#                (over layers, as % of H, and per layer), and its max per layer
#   dead %       the last training step's fraction of units that fired for no token
#   tok/s        the median over the training steps
#   peak memory  the largest mem_gib of the log (GPU runs), "-" on the CPU
#   steps        the last training step (a run still in progress shows fewer)
# and says which lambdas meet the target: mean L0 <= 2% of H with val CE within
# 3% of lambda = 0. H is read from the run's newest checkpoint, else from the
# "model:" line of its train.log. Runs without a validation line yet are left out.
#
# usage: scripts/sweep_results.sh DIR
set -euo pipefail

die() { echo "error: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: scripts/sweep_results.sh DIR"
case "$1" in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
dir=$1
[ -d "$dir" ] || die "$dir is not a directory"

# the FFN width H of a run: the header of its newest model checkpoint (int32 [8]),
# else the trainer's "model: ..., H 704, ..." line
hidden_of() {
    local d=$1 f h=""
    f=$(ls "$d"/model_*.bin 2> /dev/null | sort | tail -n 1 || true)
    if [ -n "$f" ] && [ "$(od -An -t d4 -N 4 "$f" | tr -d ' ')" = 20261122 ]; then
        h=$(od -An -t d4 -j 32 -N 4 "$f" | tr -d ' ')
    elif [ -f "$d/train.log" ]; then
        h=$(sed -n 's/^model: .*, H \([0-9][0-9]*\), .*/\1/p' "$d/train.log" | tail -n 1)
    fi
    echo "${h:--}"
}

# one tab-separated record per run: lambda steps val_ce l0_mean l0_max dead tok_per_s mem_gib H L
# l0_mean per layer, l0_max per layer, dead per layer (those three comma-separated), acc_norm acc eval_n
records=$(mktemp)
trap 'rm -f "$records"' EXIT
for d in "$dir"/lambda_*; do
    [ -f "$d/log.jsonl" ] || continue
    lambda=${d##*/lambda_}
    grep -q '^{"type":"val"' "$d/log.jsonl" || { echo "results: $d has no validation yet, left out" >&2; continue; }
    tok=$(sed -n 's/^{"type":"train",.*"tok_per_s":\([-0-9.e+a-z]*\),.*/\1/p' "$d/log.jsonl" | sort -g |
          awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}')
    awk -v lambda="$lambda" -v tok="$tok" -v H="$(hidden_of "$d")" '
        function num(line, key,    i, s) {          # the value of "key": in a flat JSON line
            i = index(line, "\"" key "\":")
            if (i == 0) return ""
            s = substr(line, i + length(key) + 3)
            sub(/[,}].*/, "", s)
            return s
        }
        function arr(line, key,    i, s) {          # "key":[a,b,c] inside "layers", as a,b,c
            i = index(line, "\"layers\":{")
            s = substr(line, i)
            i = index(s, "\"" key "\":[")
            if (i == 0) return ""
            s = substr(s, i + length(key) + 4)
            sub(/\].*/, "", s)
            return s
        }
        /^\{"type":"train"/ { train = $0; m = num($0, "mem_gib"); if (m != "" && (mem == "" || m + 0 > mem + 0)) mem = m }
        /^\{"type":"val"/ { val = num($0, "val_ce") }
        /^\{"type":"eval"/ { acc_norm = num($0, "acc_norm"); acc = num($0, "acc"); eval_n = num($0, "n") }
        END {
            if (train == "") { steps = "-"; l0 = "-"; l0max = "-"; dead = "-"; L = "-"; lm = lx = ld = "" }
            else {
                steps = num(train, "step"); l0 = num(train, "l0_mean"); l0max = num(train, "l0_max"); dead = num(train, "dead")
                lm = arr(train, "l0_mean"); lx = arr(train, "l0_max"); ld = arr(train, "dead")
                L = split(lm, parts, ",")
            }
            if (mem == "") mem = "-"
            if (eval_n == "") acc_norm = acc = eval_n = "-"
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", lambda, steps, val, l0, l0max, dead, tok, mem, H, L, lm, lx, ld,
                acc_norm, acc, eval_n
        }' "$d/log.jsonl" >> "$records"
done
[ -s "$records" ] || die "$dir holds no run with a validation line (lambda_*/log.jsonl)"

sort -t "$(printf '\t')" -k1,1g "$records" | awk -F '\t' -v csv="$dir/results.csv" -v md="$dir/results.md" '
    function isnum(x) { return x ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ }
    function fmt(f, x,    s) {                    # "-" for a missing value; no "-0.00"
        if (!isnum(x)) return "-"
        s = sprintf(f, x)
        if (s ~ /^-0\.?0*%?$/) s = substr(s, 2)
        return s
    }
    function join(s, f, sep, scale,    n, p, i, out) {   # reformat a comma list
        if (s == "") return "-"
        n = split(s, p, ",")
        out = ""
        for (i = 1; i <= n; i++) out = out (i > 1 ? sep : "") sprintf(f, p[i] * scale)
        return out
    }
    {
        n++
        for (i = 1; i <= NF; i++) r[n, i] = $i
        if ($1 + 0 == 0 && isnum($3)) ref = $3
        if (isnum($10) && $10 > maxL) maxL = $10
    }
    END {
        # results.csv
        printf "lambda,steps,val_ce,val_ce_delta_pct,acc_norm,acc,eval_n,l0_mean,l0_pct_h,l0_max,dead_pct,tok_per_s,peak_mem_gib,hidden,layers" > csv
        for (l = 0; l < maxL; l++) printf ",l0_mean_layer%d", l > csv
        for (l = 0; l < maxL; l++) printf ",l0_max_layer%d", l > csv
        for (l = 0; l < maxL; l++) printf ",dead_pct_layer%d", l > csv
        printf "\n" > csv
        for (k = 1; k <= n; k++) {
            val = r[k, 3]; H = r[k, 9]; l0 = r[k, 4]
            delta[k] = (ref != "" && isnum(val)) ? 100 * (val - ref) / ref : ""
            pct[k] = (isnum(H) && isnum(l0) && H > 0) ? 100 * l0 / H : ""
            printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s", r[k, 1], r[k, 2], val, fmt("%.4f", delta[k]), r[k, 14],
                r[k, 15], r[k, 16], l0, fmt("%.4f", pct[k]), r[k, 5], fmt("%.4f", 100 * r[k, 6]), r[k, 7], r[k, 8], H, r[k, 10] > csv
            for (j = 11; j <= 13; j++) {
                cnt = split(r[k, j], p, ",")
                for (l = 1; l <= maxL; l++) printf ",%s", (l <= cnt ? (j == 13 ? sprintf("%.4f", 100 * p[l]) : p[l]) : "") > csv
            }
            printf "\n" > csv
        }
        # results.md
        print "| lambda | steps | val CE | vs lambda = 0 | acc_norm (acc) | mean L0 (% of H) | L0 mean per layer | L0 max per layer | dead % | tok/s | peak mem (GiB) |" > md
        print "|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|" > md
        for (k = 1; k <= n; k++) {
            d = r[k, 1] + 0 == 0 ? "ref." : fmt("%+.2f%%", delta[k])
            l0 = isnum(r[k, 4]) ? sprintf("%.1f (%s)", r[k, 4], fmt("%.2f%%", pct[k])) : "-"
            acc = isnum(r[k, 14]) ? sprintf("%.4f (%.4f)", r[k, 14], r[k, 15]) : "-"
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r[k, 1], r[k, 2], fmt("%.4f", r[k, 3]), d, acc, l0,
                join(r[k, 11], "%.1f", " / ", 1), join(r[k, 12], "%d", " / ", 1), fmt("%.1f", 100 * r[k, 6]),
                fmt("%.0f", r[k, 7]), fmt("%.2f", r[k, 8]) > md
        }
        met = ""; best = 0
        for (k = 1; k <= n; k++) {
            if (pct[k] != "" && delta[k] != "" && pct[k] <= 2 && delta[k] <= 3) {
                met = met (met == "" ? "" : ", ") r[k, 1]
                if (best == 0 || pct[k] < pct[best]) best = k
            }
        }
        printf "\n" > md
        if (ref == "") line = "Target (mean L0 <= 2% of H with val CE within 3% of lambda = 0): no lambda = 0 run to compare with."
        else if (met == "") line = "Target (mean L0 <= 2% of H with val CE within 3% of lambda = 0): met by no lambda."
        else line = sprintf("Target (mean L0 <= 2%% of H with val CE within 3%% of lambda = 0): met by lambda %s; the sparsest, lambda %s, fires %.2f%% of H at val CE %+.2f%%.", met, r[best, 1], pct[best], delta[best])
        print line > md
        print line
    }'
echo "results: $dir/results.csv, $dir/results.md"
