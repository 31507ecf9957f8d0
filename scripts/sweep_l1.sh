#!/usr/bin/env bash
# sweep_l1.sh: trains one model per L1 coefficient lambda with train_gpt_sparse,
# one run after the other, or one run per GPU at a time when there are several,
# then writes the results table (scripts/sweep_results.sh: results.csv and
# results.md) and the plots (scripts/plot_sweep.sh, when gnuplot is installed).
#
# usage: scripts/sweep_l1.sh [flags] [-- TRAIN_ARGS...]
#   -l, --lambdas LIST     lambdas, separated by commas or spaces
#                          (default: 0,5e-3,1e-2,2e-2,3e-2,5e-2)
#   -o, --out DIR          the sweep's directory (default: sweeps/l1); lambda v trains in DIR/lambda_v
#   -g, --gpus LIST        GPU ids, comma-separated, or "cpu" (default: $CUDA_VISIBLE_DEVICES if set,
#                          else every GPU that nvidia-smi lists, else the CPU)
#   -i, --train-data GLOB  training shards (default: the trainer's, the embedded corpus)
#   -j, --val-data GLOB    validation shards (default: the trainer's)
#   --bin PATH             the trainer (default: train_gpt_sparse in the repository root)
#   --report-only          train nothing; rebuild the tables and plots from the runs in DIR
#   -h, --help             this text
#   -- TRAIN_ARGS          passed to every run, e.g. -- -x 2000 --model default; with
#                          --eval-file FILE (dev/data/hellaswag.sh) the table and plots show accuracy
#
# Resumable: a run whose log.jsonl has the validation line of its last step and
# whose last checkpoint exists is skipped; an unfinished run continues from its
# newest checkpoint with --resume 1, or starts over (--overwrite 1) if it has
# none. Run the same command again after an interruption (each run in progress
# writes a checkpoint of its step as it stops). Each run's console output is
# appended to DIR/lambda_v/train.log and its command line is in
# DIR/lambda_v/command.txt.
#
# On the CPU, without -x in TRAIN_ARGS, each run is the trainer's short first
# run (150 steps), and the sweep says so.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

lambdas_arg="0,5e-3,1e-2,2e-2,3e-2,5e-2"
out="sweeps/l1"
gpus_arg=""
train_data=""
val_data=""
bin="$repo/train_gpt_sparse"
report_only=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -l|--lambdas|-o|--out|-g|--gpus|-i|--train-data|-j|--val-data|--bin)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                -l|--lambdas) lambdas_arg=$2 ;;
                -o|--out) out=$2 ;;
                -g|--gpus) gpus_arg=$2 ;;
                -i|--train-data) train_data=$2 ;;
                -j|--val-data) val_data=$2 ;;
                --bin) bin=$2 ;;
            esac
            shift 2 ;;
        --lambdas=*) lambdas_arg=${1#*=}; shift ;;
        --out=*) out=${1#*=}; shift ;;
        --gpus=*) gpus_arg=${1#*=}; shift ;;
        --train-data=*) train_data=${1#*=}; shift ;;
        --val-data=*) val_data=${1#*=}; shift ;;
        --bin=*) bin=${1#*=}; shift ;;
        --report-only) report_only=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown flag '$1' (see --help; arguments for train_gpt_sparse go after --)" ;;
    esac
done
[ -n "$out" ] || die "--out is empty"

# the lambdas: numbers, each once (the directory name keeps the spelling given)
lambdas=()
for v in ${lambdas_arg//,/ }; do
    [[ "$v" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] || die "lambda '$v' is not a non-negative number"
    for w in "${lambdas[@]+"${lambdas[@]}"}"; do
        if awk -v a="$v" -v b="$w" 'BEGIN {exit !(a + 0 == b + 0)}'; then die "lambda $v is given twice ($w)"; fi
    done
    lambdas+=("$v")
done
[ ${#lambdas[@]} -gt 0 ] || die "--lambdas is empty"

if [ $report_only -eq 0 ]; then
    # the sweep owns these flags of the trainer
    for a in "${extra[@]+"${extra[@]}"}"; do
        case "$a" in
            -a|--l1|--l1=*) die "lambda is set by --lambdas, not by '$a' in the trainer's arguments" ;;
            -o|--output-dir|--output-dir=*) die "each run's directory is set by --out, not by '$a' in the trainer's arguments" ;;
            -y|--resume|--resume=*|--overwrite|--overwrite=*) die "resuming is automatic; drop '$a' from the trainer's arguments" ;;
        esac
    done
    [ -e "$bin" ] || die "$bin not found: build it with 'make' (or give --bin PATH)"
    [ -x "$bin" ] || die "$bin is not executable"
    if [ -n "$train_data" ]; then extra=(-i "$train_data" "${extra[@]+"${extra[@]}"}"); fi
    if [ -n "$val_data" ]; then extra=(-j "$val_data" "${extra[@]+"${extra[@]}"}"); fi

    # where runs go: GPU ids, or "cpu"
    if [ -z "$gpus_arg" ]; then
        if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
            gpus_arg=${CUDA_VISIBLE_DEVICES:-cpu} # set but empty: no GPU
        elif command -v nvidia-smi > /dev/null 2>&1 && n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ') && [ "$n" -gt 0 ]; then
            gpus_arg=$(seq -s, 0 $((n - 1)))
        else
            gpus_arg=cpu
        fi
    fi
    slots=()
    if [ "$gpus_arg" = cpu ]; then
        slots=(cpu)
    else
        for g in ${gpus_arg//,/ }; do
            [[ "$g" =~ ^[0-9A-Za-z-]+$ ]] || die "--gpus: '$g' is not a GPU id"
            slots+=("$g")
        done
        [ ${#slots[@]} -gt 0 ] || die "--gpus is empty"
    fi

    # the last step of a run: -x in the arguments, else the trainer's default (from its --help); on the CPU that
    # is a short first run, which each run then makes
    max_steps=""
    prev=""
    for a in "${extra[@]+"${extra[@]}"}"; do
        case "$prev" in -x|--max-steps) max_steps=$a ;; esac
        case "$a" in --max-steps=*) max_steps=${a#*=} ;; esac
        prev=$a
    done
    if [ -z "$max_steps" ]; then
        help=$("$bin" --help)
        full=$(echo "$help" | sed -n 's/.*--max-steps .*\[\([0-9][0-9]*\)\]$/\1/p')
        short=$(echo "$help" | sed -n 's/.*--max-steps .*a short first run of \([0-9][0-9]*\)).*/\1/p')
        [ -n "$full" ] && [ -n "$short" ] || die "cannot read the default --max-steps from '$bin --help'"
        if [ "${slots[0]}" = cpu ]; then
            max_steps=$short
            echo "on the CPU: each of the ${#lambdas[@]} runs is the trainer's short first run of $short steps (10 to 15" \
                 "minutes each on 2 cores); -- -x $full makes the full runs (hours each on a CPU)"
        else
            max_steps=$full
            extra=(-x "$max_steps" "${extra[@]+"${extra[@]}"}")
        fi
    fi
    [[ "$max_steps" =~ ^[0-9]+$ ]] || die "-x/--max-steps '$max_steps' is not a number"
    max_steps=$((10#$max_steps))

    mkdir -p "$out"
    step_name=$(printf '%08d' "$max_steps")
    # finished | resume | fresh, or "ahead N" when the log already goes past max_steps
    run_state() {
        local d=$1 log="$1/log.jsonl" last_val
        if [ -f "$log" ]; then
            last_val=$(sed -n 's/^{"type":"val","step":\([0-9]*\),.*/\1/p' "$log" | tail -n 1)
            if [ -n "$last_val" ] && [ "$last_val" -gt "$max_steps" ]; then echo "ahead $last_val"; return; fi
            if [ "$last_val" = "$max_steps" ] && [ -f "$d/model_$step_name.bin" ]; then echo finished; return; fi
        fi
        local f s
        for f in "$d"/state_*_00000.bin; do
            [ -f "$f" ] || continue
            s=${f##*/state_}; s=${s%_00000.bin}
            if [ -f "$d/model_$s.bin" ]; then echo resume; return; fi
        done
        echo fresh
    }

    todo=()
    for v in "${lambdas[@]}"; do
        d="$out/lambda_$v"
        state=$(run_state "$d")
        case "$state" in
            finished) echo "lambda $v: finished ($d), skipped" ;;
            ahead*) die "$d holds a run validated at step ${state#ahead }, past -x $max_steps: use another --out or the same -x" ;;
            *) todo+=("$v") ;;
        esac
    done

    # starts one run in the background (the trainer itself, so that it can be
    # stopped by its pid); the loop below collects its exit status
    start_run() { # start_run LAMBDA SLOT_INDEX
        local v=$1 slot=${slots[$2]} d="$out/lambda_$1" state where="the CPU" visible=""
        mkdir -p "$d"
        state=$(run_state "$d")
        local cmd=("$bin" -a "$v" -o "$d" "${extra[@]+"${extra[@]}"}")
        # fresh: whatever an earlier attempt left there (a log, no checkpoint) is replaced
        if [ "$state" = resume ]; then cmd+=(-y 1); else cmd+=(--overwrite 1); fi
        printf '%q ' "${cmd[@]}" > "$d/command.txt"
        echo >> "$d/command.txt"
        # on the CPU, hide every GPU so that the trainer takes the CPU path
        if [ "$slot" != cpu ]; then where="GPU $slot"; visible=$slot; fi
        echo "lambda $v: $(if [ "$state" = resume ]; then echo resuming; else echo training; fi) on $where (console: $d/train.log)"
        {
            echo "=== $(date '+%Y-%m-%d %H:%M:%S') on $where: $(cat "$d/command.txt")"
            CUDA_VISIBLE_DEVICES=$visible exec "${cmd[@]}"
        } >> "$d/train.log" 2>&1 &
        pids[$2]=$!
        running[$2]=$v
        started[$2]=$SECONDS
    }

    pids=(); running=(); started=()
    failed=()
    stop() {
        trap - INT TERM
        echo "interrupted: stopping the runs in progress (run the same command again to resume)" >&2
        local i
        for i in "${!pids[@]}"; do
            if [ -n "${pids[$i]}" ]; then kill "${pids[$i]}" 2> /dev/null || true; fi
        done
        wait 2> /dev/null || true
        exit 130
    }
    trap stop INT TERM
    next=0
    while :; do
        busy=0
        for i in "${!slots[@]}"; do
            if [ -n "${pids[$i]:-}" ] && ! kill -0 "${pids[$i]}" 2> /dev/null; then
                rc=0; wait "${pids[$i]}" || rc=$?
                v=${running[$i]}; d="$out/lambda_$v"
                if [ $rc -eq 0 ] && [ "$(run_state "$d")" = finished ]; then
                    val=$(sed -n 's/^{"type":"val",.*"val_ce":\([-0-9.e+a-z]*\)[,}].*/\1/p' "$d/log.jsonl" | tail -n 1)
                    echo "lambda $v: done in $((SECONDS - started[i])) s, val ce $val"
                else
                    echo "lambda $v: FAILED (exit $rc); the end of $d/train.log:" >&2
                    tail -n 5 "$d/train.log" | sed 's/^/    /' >&2
                    failed+=("$v")
                fi
                pids[i]=""
            fi
            if [ -z "${pids[$i]:-}" ] && [ $next -lt ${#todo[@]} ]; then
                start_run "${todo[$next]}" "$i"
                next=$((next + 1))
            fi
            if [ -n "${pids[$i]:-}" ]; then busy=1; fi
        done
        if [ $busy -eq 0 ] && [ $next -ge ${#todo[@]} ]; then break; fi
        # a wait on a background sleep lets the INT/TERM trap run at once
        sleep 0.25 &
        wait $! || true
    done
    trap - INT TERM
fi

"$repo/scripts/sweep_results.sh" "$out"
if command -v gnuplot > /dev/null 2>&1; then
    "$repo/scripts/plot_sweep.sh" "$out"
else
    echo "plots: skipped, gnuplot is not installed (apt-get install gnuplot-nox; then scripts/plot_sweep.sh $out)"
fi
if [ $report_only -eq 0 ] && [ ${#failed[@]} -gt 0 ]; then
    die "${#failed[@]} run(s) failed: lambda ${failed[*]} (see their train.log)"
fi
