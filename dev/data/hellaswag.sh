#!/usr/bin/env bash
# Downloads HellaSwag's validation set (10042 examples, JSON lines with ctx, endings and label) and
# tokenizes it into the multiple-choice eval file that train_gpt_sparse --eval-file and infer --eval read
# (docs/MODEL.md), as llm.c's dev/data/hellaswag.py renders the examples: DIR/hellaswag_val.bin. The
# download is kept (DIR/hellaswag_val.jsonl) and a rerun only tokenizes again.
#
# It needs, beyond this repository: curl, and g++ and make to build ./tokenize.
#
#   bash dev/data/hellaswag.sh [-m gpt2|llama3] [--tokenizer FILE] [-o DIR] [--local FILE]
#
#   -m          gpt2 (default) or llama3 (needs --tokenizer: Llama-3's tiktoken rank file)
#   --tokenizer the tokenizer of the model to evaluate: a tiktoken rank file (default
#               data/r50k_base.tiktoken) or a Hugging Face tokenizer.json (hf_convert --import writes one)
#   -o          output directory; default dev/data/hellaswag
#   --local F   no download: tokenize the JSON-lines file F instead (any number of examples)
# HELLASWAG_URL, if set, replaces the address of the file (a mirror); the examples are then not
# counted against the official 10042.
set -euo pipefail
cd "$(dirname "$0")/../.."

URL=https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
EXAMPLES=10042

die() { echo "error: $*" >&2; exit 1; }

model=gpt2; tokenizer=""; dir=dev/data/hellaswag; local_file=""
want_value() { [ $# -ge 2 ] || die "$1 needs a value (see the top of $0)"; }
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -m) want_value "$@"; model=$2; shift 2 ;;
        --tokenizer) want_value "$@"; tokenizer=$2; shift 2 ;;
        -o) want_value "$@"; dir=$2; shift 2 ;;
        --local) want_value "$@"; local_file=$2; shift 2 ;;
        *) die "unknown argument '$1' (see the top of $0, or --help)" ;;
    esac
done
[ "$model" = gpt2 ] || [ "$model" = llama3 ] || die "-m is gpt2 or llama3, got '$model'"
[ "$model" = gpt2 ] || [ -n "$tokenizer" ] || die "-m llama3 needs --tokenizer FILE: Llama-3's tiktoken rank file"
tokenizer=${tokenizer:-data/r50k_base.tiktoken}
[ -f "$tokenizer" ] || die "tokenizer file $tokenizer does not exist"
[ -z "$local_file" ] || [ -f "$local_file" ] || die "--local $local_file is not a file"
[ -n "$local_file" ] || command -v curl > /dev/null || die "missing: curl (apt-get install curl)"
if [ ! -x tokenize ] || [ tools/tokenize.cpp -nt tokenize ]; then
    { command -v make > /dev/null && command -v g++ > /dev/null; } || die "missing: make and g++ to build ./tokenize"
fi
! command -v make > /dev/null || make -s tokenize # rebuilds it if a source changed

mkdir -p "$dir"
count=()
if [ -n "$local_file" ]; then
    jsonl=$local_file
else
    jsonl=$dir/hellaswag_val.jsonl
    if [ -n "${HELLASWAG_URL:-}" ]; then URL=$HELLASWAG_URL; else count=(--total-docs "$EXAMPLES"); fi
    if [ ! -f "$jsonl" ]; then
        echo "hellaswag: downloading $URL"
        # into a partial file first, so that an interrupted download is never taken for the data set
        curl -fLsS --retry 5 --connect-timeout 30 -o "$jsonl.part" "$URL" || { rm -f "$jsonl.part"; die "cannot download $URL"; }
        mv "$jsonl.part" "$jsonl"
    fi
fi
./tokenize --hellaswag -o "$dir/hellaswag_val.bin" --vocab "$model" -t "$tokenizer" "${count[@]+"${count[@]}"}" "$jsonl"
echo "hellaswag: done. Evaluate with"
echo "  ./train_gpt_sparse --eval-file $dir/hellaswag_val.bin ...   (every --eval-every steps)"
echo "  ./infer -m out --eval $dir/hellaswag_val.bin"
