"""
The paper's TwELL kernels beside ours on the same inputs. The paper's repository
(github.com/SakanaAI/sparser-faster-llms) is read from a checkout named on the
command line and never copied into this one: its custom_models/twell_modules
builds, as its twell.py does, into a torch extension for sm_90a (torch's
cpp_extension.load, ninja, nvcc; a few minutes the first time, cached after in
TORCH_EXTENSIONS_DIR).

Inputs: the directory that build/dev/bench_twell wrote with BENCH_DUMP=DIR (its
header says the format): per pattern f [M, D], Wg, Wu, WdT [H, D] in bf16, our y
and our times. The reference takes the same layouts: GATE = Wg and UP = Wu as
[H, D], DOWN = WdT as [H, D] (its down_proj.weight.T), x = f as [M, D].

Per pattern it runs the reference as a model calls it (TwELLGatedMLP, the gate's
packing at compression 8 and the fused gated up + down), and its two stages alone
(D2TLinear, GatedT2DLinear); times them as bench_twell does (median of --iters
runs between CUDA events after 3 warm-up runs, 256 MB written before each run so
that the last run's data is out of L2, the functions in turn round by round; the
host's time to queue a run is hidden) with a dense bf16 FFN in torch beside them
(not our dense path, but its time over bench_twell's dense time stays the same
from pattern to pattern where the two runs saw the same clock); and prints the error of the reference's y and of ours against a dense
fp32 FFN on the same inputs, max|y - y32| / max|y32|. The ratio is reference time
/ our time: 1.5x means ours takes 1/1.5 of the reference's time. Our times come
from bench_twell's own run, timed there as this script times the reference (a dense
FFN, the whole and the two stages in turn).

The reference's limits, from its code: compute capability 9.0 with at least 128
SMs (its gate is a persistent grid of 128 CTAs in clusters of 2), D = 2048 (its
up + down is compiled for that width only), H / 256 in {22, 32}, M a multiple of
256. A tile of 256 units keeps 256 / compression - 1 activations per row (31 at
8); past that it keeps counting, but its slots wrap around and the up + down
reads some twice: "over" counts such (row, tile) pairs, and its error shows them.

usage: python3 dev/bench_twell_reference.py CHECKOUT DUMP_DIR [--iters N] [--only NAME]
           [--compression 8|4|2] [--flex] [--verbose]
       (dev/bench_twell_reference.sh runs bench_twell for the dumps, then this)
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

SOURCES = ["twell.py", "twell.cpp", "matmul_d2t.cu", "matmul_t2d.cu", "matmul_gated_t2d.cu", "mlp_twell.cu"]
NAMES = ["get_ext", "TwELLGatedMLP", "D2TLinear", "GatedT2DLinear", "allocate_packed_output"]
FILES = {"f": "MD", "wg": "HD", "wu": "HD", "wdT": "HD", "y": "MD"}  # each file's shape, [M, D] or [H, D]
FLUSH_BYTES = 256 << 20
SPIN_CYCLES = 200_000  # ~0.1 ms at the H100's and H200's 1.98 GHz


def fail(msg):
    print(f"bench_twell_reference: {msg}", file=sys.stderr)
    sys.exit(1)


def load_reference(checkout, verbose):
    """twell.py of the checkout, imported from its file (the package's __init__ pulls in transformers)."""
    mod_dir = Path(checkout) / "custom_models" / "twell_modules"
    if not Path(checkout).is_dir():
        fail(f"{checkout}: no such directory (a checkout of github.com/SakanaAI/sparser-faster-llms)")
    missing = [s for s in SOURCES if not (mod_dir / s).is_file()]
    if missing:
        fail(f"{mod_dir} lacks {', '.join(missing)}: not a checkout of sparser-faster-llms with its TwELL kernels")
    # its kernels use wgmma: sm_90a, whatever the environment says (twell.py only sets a default)
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    spec = importlib.util.spec_from_file_location("twell_reference", mod_dir / "twell.py")
    twell = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(twell)
    except Exception as e:
        fail(f"importing {mod_dir / 'twell.py'} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    absent = [n for n in NAMES if not hasattr(twell, n)]
    if absent:
        fail(f"{mod_dir / 'twell.py'} has no {', '.join(absent)}: another version of the reference than this script reads")
    try:
        ext = twell.get_ext(algorithms=["twell_mlp"], verbose=verbose)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        if verbose:
            raise
        fail(f"building the reference's extension failed ({type(e).__name__}: {first}); --verbose shows the compiler")
    return twell, ext


def checkout_revision(checkout):
    if not (Path(checkout) / ".git").exists():  # (an exported tree inside this repository would name ours)
        return "(no git)"
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "(no git)"
    except (OSError, subprocess.SubprocessError):
        return "(no git)"


def load_meta(d):
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError) as e:
        fail(f"{d / 'meta.json'}: {e}")
    for key in ("name", "M", "D", "H", "sparse_ms", "gate_ms", "up_down_ms", "dense_ms", "active", "records"):
        if key not in meta:
            fail(f"{d / 'meta.json'} has no \"{key}\": written by another version of bench_twell")
    return meta


def load_tensors(torch, d, meta):
    """the five tensors of one pattern's directory, on the GPU; exits on a size mismatch"""
    rows = {"M": meta["M"], "H": meta["H"]}
    t = {}
    for name, shape in FILES.items():
        path = d / f"{name}.bin"
        r, c = rows[shape[0]], meta["D"]
        want = r * c * 2
        if not path.is_file():
            fail(f"{path}: missing")
        if path.stat().st_size != want:
            fail(f"{path}: {path.stat().st_size} bytes, [{r}, {c}] bf16 is {want} (meta.json: M {meta['M']} "
                 f"D {meta['D']} H {meta['H']})")
        t[name] = torch.from_file(str(path), shared=False, size=r * c, dtype=torch.bfloat16).view(r, c).cuda()
    return t


def reference_limits(meta, props):
    """why the reference cannot run this pattern, or None"""
    M, D, H = meta["M"], meta["D"], meta["H"]
    if (props.major, props.minor) != (9, 0):
        return f"compute capability {props.major}.{props.minor}: its kernels are sm_90a"
    if props.multi_processor_count < 128:
        return f"{props.multi_processor_count} SMs: its gate runs 128 CTAs at once"
    if D != 2048:
        return f"D {D}: its up + down is built for D 2048 only"
    if H % 256 != 0 or H // 256 not in (22, 32):
        return f"H {H}: its up + down takes H 5632 or 8192"
    if M % 256 != 0:
        return f"M {M}: its gate takes M a multiple of 256"
    return None


def median_ms_interleaved(torch, fns, iters, warmup=3):
    """bench_twell's timing: medians over rounds of every fn in turn, L2 flushed by 256 MB of writes before each
    run; then a spin of ~0.1 ms keeps the GPU busy while Python queues the run (tens of us through the
    reference's Python layers; bench_twell's C++ calls take a few), so that the events time the GPU's work"""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = [[] for _ in fns]
    for r in range(iters):
        for k, fn in enumerate(fns):
            flush.fill_(r & 0xFF)
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(SPIN_CYCLES)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            ms[k].append(start.elapsed_time(stop))
    return [sorted(m)[iters // 2] for m in ms]


def rel_err(torch, y, y32):
    if torch.isnan(y).any():
        return float("nan")
    return ((y.float() - y32).abs().max() / y32.abs().max()).item()


def run_pattern(torch, twell, ext, meta, t, args, layer):
    M, D, H = meta["M"], meta["D"], meta["H"]
    f, wg, wu, wdT = t["f"], t["wg"], t["wu"], t["wdT"]
    cf, flex = args.compression, args.flex or args.compression != 8
    with torch.no_grad():
        g32 = f.float() @ wg.float().t()
        y32 = (torch.relu(g32) * (f.float() @ wu.float().t())) @ wdT.float()
        del g32

        # as a model calls it (twell.py's TwELLGatedMLP), and its two stages on a packed buffer of ours
        mlp = twell.TwELLGatedMLP(layer_number=layer, GATE=wg, UP=wu, DOWN=wdT, compression_factor=cf,
                                  flex_kernels=flex, ext=ext)
        d2t = twell.D2TLinear(layer_number=layer + 1, B=wg, compression_factor=cf, ext=ext)
        up_down = twell.GatedT2DLinear(UP=wu, DOWN=wdT, compression_factor=cf, flex_kernels=flex, ext=ext)
        packed = twell.allocate_packed_output(M, H, device=f.device, compression_factor=cf)
        y_ref = torch.empty_like(f)
        try:
            y_ref.copy_(mlp(f))
            d2t(f, packed)
            torch.cuda.synchronize()
        except RuntimeError as e:
            fail(f"{meta['name']}: the reference failed: {str(e).splitlines()[0]}")
        slots = 256 // cf - 1  # word 0 of a tile's row is its count
        counts = packed.view(torch.int32).view(M, H // 256, 256 // cf)[:, :, 0]
        over = int((counts > slots).sum().item())
        active = counts.sum().item() / M

        def dense():
            return (torch.relu(f @ wg.t()) * (f @ wu.t())) @ wdT

        ms = median_ms_interleaved(torch, [dense, lambda: mlp(f), lambda: d2t(f, packed),
                                           lambda: up_down(f, packed)], args.iters)
        err_ref, err_ours = rel_err(torch, y_ref, y32), rel_err(torch, t["y"], y32)
        mlp.destroy()
        d2t.destroy()
    return {"torch_dense": ms[0], "total": ms[1], "gate": ms[2], "up_down": ms[3], "active": active, "over": over,
            "tiles": M * (H // 256), "err_ref": err_ref, "err_ours": err_ours}


def main():
    ap = argparse.ArgumentParser(description="the paper's TwELL kernels beside ours (dev/bench_twell's dumps)")
    ap.add_argument("checkout", help="a checkout of github.com/SakanaAI/sparser-faster-llms")
    ap.add_argument("dump", help="the directory build/dev/bench_twell wrote with BENCH_DUMP")
    ap.add_argument("--iters", type=int, default=20, help="timed rounds (median), as bench_twell's iters")
    ap.add_argument("--only", help="the pattern of this name only, e.g. \"uniform k=30\"")
    ap.add_argument("--compression", type=int, default=8, choices=(8, 4, 2),
                    help="the reference's packing: 256/c - 1 slots a tile (4 and 2 take its flex kernels)")
    ap.add_argument("--flex", action="store_true", help="the reference's flex up + down also at compression 8")
    ap.add_argument("--verbose", action="store_true", help="show the extension's build")
    args = ap.parse_args()
    if args.iters < 1:
        fail("--iters must be >= 1")
    dump = Path(args.dump)
    dirs = sorted(p.parent for p in dump.glob("*/meta.json"))
    if not dirs:
        fail(f"{dump}: no <pattern>/meta.json (run build/dev/bench_twell with BENCH_DUMP={dump} first)")

    try:
        import torch
    except ImportError:
        fail("no torch in this python3")
    if not torch.cuda.is_available():
        fail("torch sees no GPU")
    # the fp32 reference: no TF32 in its products
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    twell, ext = load_reference(args.checkout, args.verbose)
    # its kernels launch on stream 0: the events must be recorded there too
    if torch.cuda.current_stream().cuda_stream != 0:
        fail("torch's current stream is not the default stream, where the reference's kernels run")

    print(f"{props.name}, {props.multi_processor_count} SMs. The reference: {args.checkout} at "
          f"{checkout_revision(args.checkout)}, compression {args.compression}, flex {'on' if args.flex or args.compression != 8 else 'off'}. "
          f"Median of {args.iters} runs, L2 flushed before each")
    rows = []
    for i, d in enumerate(dirs):
        meta = load_meta(d)
        if args.only and meta["name"] != args.only:
            continue
        print(f"\n{meta['name']} (M {meta['M']} D {meta['D']} H {meta['H']})")
        if meta.get("gpu") and meta["gpu"] != props.name:
            print(f"  note: ours was timed on {meta['gpu']}, this is {props.name}: the times do not compare")
        why = reference_limits(meta, props)
        if why:
            print(f"  the reference cannot run it: {why}")
            rows.append((meta, None))
            continue
        t = load_tensors(torch, d, meta)
        r = run_pattern(torch, twell, ext, meta, t, args, 2 * i)
        del t
        print(f"  reference: gate + pack {r['gate']:.3f} ms, up + down {r['up_down']:.3f} ms, TwELLGatedMLP "
              f"{r['total']:.3f} ms; {r['active']:.1f} active per row, {r['over']} of {r['tiles']} (row, tile) "
              f"past their {256 // args.compression - 1} slots")
        print(f"  ours:      gate + pack {meta['gate_ms']:.3f} ms, up + down {meta['up_down_ms']:.3f} ms, sparse total "
              f"{meta['sparse_ms']:.3f} ms; {meta['active']:.1f} active per row, {meta['records']} overflow records")
        print(f"  dense bf16 (the clocks' check): torch {r['torch_dense']:.3f} ms here, ours {meta['dense_ms']:.3f} ms "
              f"in bench_twell's run")
        print(f"  max|y - y_fp32| / max|y_fp32|: reference {r['err_ref']:.2e}, ours {r['err_ours']:.2e}")
        rows.append((meta, r))

    print("\nms (median); ratio = reference / ours (ours takes 1/ratio of its time); err against a dense fp32 FFN;"
          " over = (row, tile) pairs past the reference's slots")
    print(f"{'pattern':<16} {'ref':>7} {'ours':>7} {'ratio':>7} {'ref err':>8} {'our err':>8} {'over':>7} "
          f"{'dense t':>7} {'dense o':>7}")
    for meta, r in rows:
        if r is None:
            print(f"{meta['name']:<16} {'n/a':>7} {meta['sparse_ms']:7.3f}")
            continue
        print(f"{meta['name']:<16} {r['total']:7.3f} {meta['sparse_ms']:7.3f} {r['total'] / meta['sparse_ms']:6.2f}x "
              f"{r['err_ref']:8.1e} {r['err_ours']:8.1e} {r['over']:7d} {r['torch_dense']:7.3f} {meta['dense_ms']:7.3f}")
    print("dense t / dense o: the dense bf16 FFN in torch here / ours in bench_twell's run; where this ratio moves"
          " between patterns, the two runs saw different clocks")


if __name__ == "__main__":
    main()
