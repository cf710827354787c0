"""Measure again the stored CPU figures of the docs that are stale or name no machine.

Each stored report under ``docs/data/`` that the pages quote is written by one command, the one
its page shows beside its table; :data:`COMMANDS` holds them. A report needs measuring again
when it records no CPU model (it predates :func:`spectra_lab.machine.device_about`) or
when a later commit changes the code it measures (``spectra docs --stale``). This script runs
the command of every such report, one after another, on this machine, then rewrites the pages'
blocks from the new files (``spectra docs``). A report already measured at the current code is
skipped, so an interrupted run resumes where it stopped. Timings want a quiet machine: stop
other jobs first.

    python experiments/remeasure.py --list        # what is stale, and the command for each
    python experiments/remeasure.py               # measure those again
    python experiments/remeasure.py --only bench_ops_cpu_recorded --force

The GPU runs under ``docs/data/gpu/`` are measured again by ``make gpu-check`` on a GPU node;
the figures a GPU gave are not measured here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_ratio(prefix: str, out: str) -> str:
    """The main job's step against its AdamW twin, from the trainer's own per-step timings: four
    300-step runs (``runs/ratio-PREFIX<optimizer>-<i>``), alternating, then their medians
    (experiments/step_ratio.py) into ``out``."""
    pairs = [(o, f"runs/ratio-{prefix}{o}-{i}") for i in (1, 2) for o in ("adamw", "spectra-adamw")]
    train = [f"spectra train --optimizer {o} --out {r} --no-progress --overwrite" for o, r in pairs]
    runs = " ".join(r for _, r in pairs)
    return " && ".join([*train, f"python experiments/step_ratio.py {runs} --json {out}"])


STEP_RATIO = step_ratio("", "docs/data/main_job_step_ratio.json")

#: What takes a CPU without bf16 units' path on a CPU that has them: spectra forms its bf16
#: products as float32 products of bf16 operands (torch's own bf16 products stay native).
NO_BF16_UNITS = "SPECTRA_CPU_BF16_UNITS=0"
NO_BF16 = f"{NO_BF16_UNITS} "

#: Each stored CPU report the pages quote, and the command that writes it (as its page shows it);
#: the reports the pages quote for a CPU without bf16 units take that path on purpose.
COMMANDS: dict[str, str] = {
    "bench_ops_cpu_recorded": NO_BF16
    + "spectra bench ops --threads 1 --repeats 3 --budget 10 --inputs recorded --methods "
    "auto eigh64 polar polar_bf16 paper_bf16 paper_fp32 --out "
    "docs/data/bench_ops_cpu_recorded.json --plot docs/figures/ops_pareto_recorded.png",
    "bench_ops_cpu_synthetic": NO_BF16
    + "spectra bench ops --threads 1 --repeats 3 --budget 10 --shapes 768x768 768x3072 "
    "2048x2048 --inputs adam_spike sign gauss --methods auto eigh64 polar polar_bf16 "
    "paper_bf16 paper_fp32 --paper-bf16 always --out docs/data/bench_ops_cpu_synthetic.json "
    "--plot docs/figures/ops_pareto_synthetic.png",
    "bench_ops_cpu": NO_BF16
    + "spectra bench ops --threads 1 --repeats 3 --budget 10 --shapes 768x768 768x3072 "
    "2048x2048 --methods auto eigh64 polar paper_bf16 paper_fp32 --out "
    "docs/data/bench_ops_cpu.json --plot docs/figures/ops_pareto.png",
    "bench_ops_cpu_native_bf16": "spectra bench ops --threads 2 --repeats 3 --shapes 768x768 "
    "768x3072 2048x2048 --inputs adam_spike sign recorded --dtypes fp32 --methods auto eigh "
    "polar mixed paper_bf16 paper_fp32 --paper-bf16 always --out "
    "docs/data/bench_ops_cpu_native_bf16.json --plot docs/figures/ops_pareto_native_bf16.png",
    "bench_ssc_vs_orth_cpu": NO_BF16
    + "spectra bench ops --sizes 128 256 512 1024 --inputs adam_spike --dtypes fp32 "
    "--methods auto paper_fp32 paper_bf16 orth_muon orth_muon_fp32 --paper-bf16 always "
    "--repeats 3 --budget 10 --threads 1 --no-progress --plot-sizes "
    "docs/figures/ssc_vs_orth.png --out docs/data/bench_ssc_vs_orth_cpu.json",
    "bench_optim_cpu_2threads": NO_BF16
    + "spectra bench optim --threads 2 --repeats 2 --methods torch-adamw torch-adamw-loop "
    "spectra-adamw spectra-adamw-eigh spectra-adamw-chunked spectra-wrap paper-wrap-bf16 "
    "paper-wrap-fp32 --json docs/data/bench_optim_cpu_2threads.json",
    "bench_optim_cpu_native_bf16_2threads": "spectra bench optim --threads 2 --repeats 2 "
    "--warmup 1 --methods torch-adamw spectra-adamw spectra-adamw-eigh spectra-adamw-polar "
    "spectra-wrap paper-wrap-bf16 paper-wrap-fp32 --json "
    "docs/data/bench_optim_cpu_native_bf16_2threads.json",
    "bench_optim_peers_cpu_2threads": "spectra bench optim --threads 2 --repeats 3 --warmup 1 "
    "--no-memory --methods torch-adamw torch-adamw-loop torch-adamw-fused torch-muon "
    "spectra-dmuon spectra-adamw --json docs/data/bench_optim_peers_cpu_2threads.json",
    "bench_optim_main_job_native_bf16": "spectra bench optim --layers 4 --dim 192 --hidden 512 "
    "--vocab 4096 --threads 2 --repeats 9 --warmup 2 --methods torch-adamw spectra-adamw "
    "spectra-adamw-eigh spectra-adamw-polar spectra-adamw-mixed paper-wrap-bf16 --no-memory "
    "--json docs/data/bench_optim_main_job_native_bf16.json",
    "bench_optim_memory_cpu_2threads": NO_BF16
    + "spectra bench optim --matrices 64 1024 --clip-c 1 --threads 2 --repeats 3 --methods "
    "torch-adamw torch-adamw-loop spectra-adamw spectra-adamw-chunked --json "
    "docs/data/bench_optim_memory_cpu_2threads.json",
    "bench_optim_memory_cpu_1thread": NO_BF16
    + "spectra bench optim --matrices 64 1024 --clip-c 1 --threads 1 --repeats 3 --methods "
    "torch-adamw torch-adamw-loop spectra-adamw spectra-adamw-chunked --json "
    "docs/data/bench_optim_memory_cpu_1thread.json",
    "bench_step_main_job_native_bf16_2threads": "spectra bench step --preset cpu-small "
    "--batch-size 16 --optimizer adamw spectra-adamw --steps 15 --warmup 3 --threads 2 "
    "--json docs/data/bench_step_main_job_native_bf16_2threads.json",
    "bench_step_main_job_2threads": NO_BF16
    + "spectra bench step --preset cpu-small --batch-size 16 --optimizer adamw spectra-adamw "
    "--steps 15 --warmup 3 --threads 2 --json docs/data/bench_step_main_job_2threads.json",
    "bench_step_main_job_1thread": NO_BF16
    + "spectra bench step --preset cpu-small --batch-size 16 --optimizer adamw spectra-adamw "
    "--steps 9 --warmup 2 --threads 1 --json docs/data/bench_step_main_job_1thread.json",
    "bench_step_cpu": NO_BF16
    + "spectra bench step --preset cpu-small --optimizer adamw spectra-adamw signum "
    "spectra-signum ademamix spectra-ademamix mars --pre-clip 0.1 --steps 8 --warmup 2 "
    "--threads 2 --json docs/data/bench_step_cpu.json",
    "bench_step_cpu_baselines": NO_BF16
    + "spectra bench step --preset cpu-small --optimizer adamw dmuon soap --steps 8 --warmup "
    "2 --threads 2 --json docs/data/bench_step_cpu_baselines.json",
    "bench_dist_cpu": NO_BF16
    + "spectra bench dist --procs 1 2 4 --repeats 10 --json docs/data/bench_dist_cpu.json",
    "bench_dist_traffic": NO_BF16
    + "spectra bench dist --no-timing --volume --traffic-procs 2 4 --json "
    "docs/data/bench_dist_traffic.json",
    "bench_memory_cpu_small": "spectra bench memory --preset cpu-small --json "
    "docs/data/bench_memory_cpu_small.json",
    "main_job_clip_step_no_bf16": NO_BF16
    + "python experiments/clip_method_step.py --methods eigh/32 eigh mixed auto --steps 15 "
    "--warmup 3 --json docs/data/main_job_clip_step_no_bf16.json",
    "main_job_clip_step_signum_no_bf16": NO_BF16
    + "python experiments/clip_method_step.py --optimizer spectra-signum --methods eigh auto "
    "--steps 15 --warmup 3 --json docs/data/main_job_clip_step_signum_no_bf16.json",
    "main_job_clip_step_avx2": "MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 "
    "ATEN_CPU_CAPABILITY=avx2 "
    + NO_BF16
    + "python experiments/clip_method_step.py --methods auto eigh mixed polar --steps 15 "
    "--warmup 3 --json docs/data/main_job_clip_step_avx2.json",
    "main_job_clip_step_avx2_epyc": "python experiments/clip_method_step.py --methods auto eigh "
    "mixed polar --steps 15 --warmup 3 --runs 3 --json "
    "docs/data/main_job_clip_step_avx2_epyc.json",
    "main_job_clip_step_signum_avx2_epyc": "python experiments/clip_method_step.py --optimizer "
    "spectra-signum --methods eigh auto --steps 15 --warmup 3 --runs 3 --json "
    "docs/data/main_job_clip_step_signum_avx2_epyc.json",
    "operator_errors_spiked": "python experiments/operator_errors.py --json "
    "docs/data/operator_errors_spiked.json",
    "mixed_error_spiked": "python experiments/mixed_error_sweep.py --spiked --json "
    "docs/data/mixed_error_spiked.json",
    "symmetric_gram_cpu": "python experiments/symmetric_gram.py --json "
    "docs/data/symmetric_gram_cpu.json",
    "baselines_state_memory": "python experiments/baselines_state_memory.py --json "
    "docs/data/baselines_state_memory.json",
    "main_job_step_ratio": STEP_RATIO,
    "main_job_step_ratio_avx2_epyc": step_ratio(
        "epyc-", "docs/data/main_job_step_ratio_avx2_epyc.json"
    ),
    "gpu_step_memory_model": "python experiments/gpu_step_memory_model.py",
    "gpu_step_memory_model_780m": "python experiments/gpu_step_memory_model.py --large",
    "gpu_step_host_ops": "python experiments/gpu_step_host_ops.py",
    "gpu_step_host_ops_780m": "python experiments/gpu_step_host_ops.py --large",
}

#: The reports of a CPU that has no bf16 units itself (not the path taken on purpose): only such
#: a CPU measures them again.
OWN_CPU_WITHOUT_BF16 = ("main_job_clip_step_avx2_epyc", "main_job_clip_step_signum_avx2_epyc",
                        "main_job_step_ratio_avx2_epyc")  # fmt: skip


#: The reports that model a GPU step on the CPU (its code path, bf16 products included, whatever
#: the CPU has): any CPU measures them alike.
ANY_CPU = ("gpu_step_memory_model", "gpu_step_memory_model_780m", "gpu_step_host_ops",
           "gpu_step_host_ops_780m")  # fmt: skip


def why(name: str, stale: dict[str, str]) -> str | None:
    """Why the report ``name`` needs measuring again (``None``: it need not)."""
    path = ROOT / "docs" / "data" / f"{name}.json"
    if not path.is_file():
        return "missing"
    report = json.loads(path.read_text())
    about = report.get("machine") or report
    if not about.get("cpu"):
        return "records no CPU model"
    emulated = str(about.get("cpu_bf16", "")).startswith("emulated")
    if name in OWN_CPU_WITHOUT_BF16:
        if about.get("cpu_bf16") != "emulated":
            return "not measured on a CPU without bf16 units"
    elif name not in ANY_CPU and emulated != (NO_BF16_UNITS in COMMANDS[name]):
        return "measured on the other bf16 path than the page quotes"
    return stale.get(name)


def main(argv: list[str] | None = None) -> int:
    from spectra_lab.bench.machines import stale_runs
    from spectra_lab.machine import cpu_bf16

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="say what is stale; run nothing")
    parser.add_argument("--only", nargs="+", default=None, choices=sorted(COMMANDS),
                        metavar="NAME", help="these reports alone")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="measure them even if current")
    args = parser.parse_args(argv)
    stale = {line.split()[0].removeprefix("docs/data/").removesuffix(".json"):
             line.split(": ", 1)[1] for line in stale_runs(ROOT)}  # fmt: skip
    names = args.only or list(COMMANDS)
    todo = {n: (why(n, stale) or ("forced" if args.force else None)) for n in names}
    todo = {n: w for n, w in todo.items() if w}
    if cpu_bf16() != "emulated":  # this CPU has bf16 units (or is told so): it cannot stand in
        for n in [n for n in todo if n in OWN_CPU_WITHOUT_BF16]:
            print(f"{n}: {todo.pop(n)}, but this CPU has bf16 units: left as it is")
    for n, w in todo.items():
        print(f"{n}: {w}\n    {COMMANDS[n]}")
    if args.list or not todo:
        print(f"{len(todo)} of {len(names)} reports to measure again")
        return 0
    bin_dir = Path(sys.executable).parent  # spectra and python of this environment first
    for i, (n, _) in enumerate(todo.items(), 1):
        print(f"[{i}/{len(todo)}] {n}", flush=True)
        t0 = time.monotonic()
        env_path = f"PATH={shlex.quote(str(bin_dir))}:$PATH"
        done = subprocess.run(f"export {env_path}; {COMMANDS[n]}", shell=True, cwd=ROOT)
        if done.returncode:
            print(f"{n}: the command failed ({done.returncode}); the rest are not run")
            return done.returncode
        print(f"[{i}/{len(todo)}] {n}: {time.monotonic() - t0:.0f} s", flush=True)
    return subprocess.run([bin_dir / "spectra", "docs"], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
