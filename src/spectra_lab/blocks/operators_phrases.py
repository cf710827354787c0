"""Figures quoted inside sentences of the operators pages, each a phrase
or a small table rendered from its stored file: :data:`OPERATORS_PHRASES`."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spectra_lab.blocks.common import (
    err_range,
    json_of,
    latest_gpu,
    ops_cells,
    polar_and_mixed,
    sci,
    value_range,
)

# --------------------------------------------------------------------------- helpers


def _x(x: float) -> str:
    """A time ratio as the page writes it: ``0.66×``, ``26×`` from ten on."""
    return f"{x:.2f}×" if x < 10 else f"{x:.0f}×"


def _x_range(vals: list[float]) -> str:
    lo, hi = min(vals), max(vals)
    return f"{_x(lo).removesuffix('×')}–{_x(hi)}" if _x(lo) != _x(hi) else _x(lo)


def _gpu_parts(folder: Path) -> dict:
    return json.loads((folder / "gpu_check.json").read_text())["parts"]


def _h200_runs(root: Path) -> list[dict]:
    """The stored H200 runs of ``docs/data/gpu/runs.json`` that timed the paper's bf16 wrapper
    at 780M (later runs leave it out there), oldest first."""
    runs = [r for r in json_of(root, "docs/data/gpu/runs.json")["runs"] if "H200" in r["gpu"]
            and "gpu_check.json" in r["files"] and _gpu_parts(root / "docs/data/gpu" / r[
                "folder"]).get("bench_optim_780m", {}).get("vs_paper_bf16")]  # fmt: skip
    return sorted(runs, key=lambda r: r["date"])


def _model_rows(root: Path, method: str, model: str) -> list[float]:
    rows = json_of(root, "docs/data/gpu_model_h100.json")["rows"]
    return [r["vs_paper_bf16"] for r in rows
            if r["method"] == method and r["model"] == model]  # fmt: skip


# --------------------------------------------------------------------------- methods


def mixed_spike_error(root: Path) -> str:
    """``mixed``'s worst error per spike (``docs/data/mixed_error_spiked.json``)."""
    stored = json_of(root, "docs/data/mixed_error_spiked.json")
    worst = [r["mixed_worst"] for r in stored["rows"]]
    return (
        f"error {err_range(min(worst), max(worst))} for any spike (measured on an "
        f"{stored['machine']['cpu']})"
    )


def main_job_threads(root: Path) -> str:
    """The main job's optimizer step by threads (``bench_step_main_job_1thread/2threads.json``)."""
    ms = {}
    for threads in ("1thread", "2threads"):
        rows = json_of(root, f"docs/data/bench_step_main_job_{threads}.json")["rows"]
        ms[threads] = next(r for r in rows if r["name"] == "spectra-adamw")["optimizer_ms"]
    return f"{ms['1thread']:.1f} ms on one thread, {ms['2threads']:.1f} on two"


def gpu_summary(root: Path) -> str:
    """``auto`` and the 124M step on the latest H200 and H100 runs (``gpu_check.json``)."""
    h200, h100 = (_gpu_parts(latest_gpu(root, g, "bench_ops.json")) for g in ("H200", "H100"))
    cells = json.loads((latest_gpu(root, "H200", "bench_ops.json") / "bench_ops.json").read_text())[
        "cells"
    ]
    n = len(cells) // len({c["method"] for c in cells})

    def ops(p: dict) -> float:
        return p["bench_ops"]["median_vs_paper_bf16"]["auto"]

    def step(p: dict) -> float:
        return p["bench_optim"]["vs_paper_bf16"]["spectra-adamw"]

    return (
        f"`auto` takes {ops(h200):.2f}× the paper's bf16 run on the H200 (median of {n} "
        f"cells; {ops(h100):.2f}× on the H100), and the 124M optimizer step "
        f"{step(h200):.2f}× the paper's bf16 wrapper ({step(h100):.2f}× on the H100)"
    )


def _h200_steps(root: Path) -> dict[str, float]:
    parts = _gpu_parts(root / "docs/data/gpu" / _h200_runs(root)[-1]["folder"])
    (polar, mixed), (polar780, mixed780) = (
        polar_and_mixed(parts[p]["vs_paper_bf16"]) for p in ("bench_optim", "bench_optim_780m")
    )
    return {"mixed": mixed, "polar": polar, "mixed780": mixed780, "polar780": polar780}


def h200_mixed_step(root: Path) -> str:
    """``mixed``'s step, ``polar``'s at 780M, on the latest H200 run (``gpu_check.json``)."""
    s = _h200_steps(root)
    return (f"{s['mixed']:.2f}× at 124M and {s['mixed780']:.2f}× at 780M (where `polar` takes "
            f"{s['polar780']:.2f}×)")  # fmt: skip


def h200_polar_error(root: Path) -> str:
    """``polar``'s and ``mixed``'s worst float32 error on the latest H200 (``gpu_check.json``)."""
    worst = _gpu_parts(latest_gpu(root, "H200"))["bench_ops"]["max_error_fp32"]
    return (f"whose worst error on float32 inputs there is {sci(worst['polar'])} against "
            f"`mixed`'s {sci(worst['mixed'])}")  # fmt: skip


def h200_mixed_vs_polar(root: Path) -> str:
    """``mixed`` and ``polar`` at 124M and 780M on the latest H200 run (``gpu_check.json``)."""
    s = _h200_steps(root)
    return (f"its optimizer step takes {s['mixed']:.2f}× the paper's bf16 wrapper at 124M and "
            f"{s['mixed780']:.2f}× at 780M, against `polar`'s {s['polar']:.2f}× and "
            f"{s['polar780']:.2f}×")  # fmt: skip


def h200_mixed_short(root: Path) -> str:
    """``mixed`` at 124M and 780M on the latest H200 run (``gpu_check.json``)."""
    s = _h200_steps(root)
    return f"{s['mixed']:.2f}× at 124M, {s['mixed780']:.2f}× at 780M"


def h100_mixed(root: Path) -> str:
    """The earlier ``mixed`` on the latest H100 run (``gpu_check.json``)."""
    vs = _gpu_parts(latest_gpu(root, "H100"))["bench_optim"]["vs_paper_bf16"]
    return f"{vs['spectra-adamw-mixed']:.2f}×"


def cuda_default(root: Path) -> str:
    """``mixed`` against ``polar`` on the latest H100 run (``gpu_check.json``): step time at
    124M and 780M and peak memory at 124M (:func:`polar_and_mixed`)."""
    folder = latest_gpu(root, "H100")
    index = json.loads((folder / "gpu_check.json").read_text())
    parts = index["parts"]

    def ratio(part: str, key: str) -> float:
        polar, mixed = polar_and_mixed(parts[part][key])
        return mixed / polar

    date = parts["bench_optim"].get("measured", index["date"])
    step, peak = ratio("bench_optim", "step_ms"), ratio("bench_optim", "peak_vs_torch_adamw")
    big = ratio("bench_optim_780m", "step_ms")
    return (f"on the H100 (run of {date}) its 124M step took {step:.2f}× `polar`'s time at "
            f"{peak:.2f}× its peak memory, and its 780M step {big:.2f}× its time")  # fmt: skip


def cuda_split_rule(root: Path) -> str:
    """``mixed`` with split bf16 products over ``mixed`` in float32, step time at 124M and
    780M on the latest H200 run that timed both (``gpu_check.json``): the basis of
    ``spectra.ops.mixed.MIXED_SPLIT_FROM``."""
    split = "spectra-adamw-mixed-bf16"

    def timed(run: dict) -> dict | None:
        """The run's parts where both sizes timed the split products."""
        if "gpu_check.json" not in run["files"]:
            return None
        parts = _gpu_parts(root / "docs/data/gpu" / run["folder"])
        sizes = ("bench_optim", "bench_optim_780m")
        return parts if all(split in parts.get(p, {}).get("step_ms", {}) for p in sizes) else None

    runs = sorted(json_of(root, "docs/data/gpu/runs.json")["runs"], key=lambda r: r["date"])
    run, parts = [(r, p) for r in runs if "H200" in r["gpu"] and (p := timed(r))][-1]
    small, big = parts["bench_optim"]["step_ms"], parts["bench_optim_780m"]["step_ms"]
    date = parts["bench_optim_780m"].get("measured", run["date"])
    fp32 = next(m for m in ("spectra-adamw-mixed-fp32", "spectra-adamw-mixed") if m in big)
    return (f"on the H200 (run of {date}, commit {run['commit']}) its step took "
            f"{small[split] / small['spectra-adamw-mixed']:.2f}× the time of its float32 form "
            f"at the 124M shapes (smaller sides 768) and {big[split] / big[fp32]:.2f}× at "
            f"the 780M ones (1280)")  # fmt: skip


def h200_780m(root: Path) -> str:
    """``polar`` and ``mixed`` at 780M on the last two H200 runs (``gpu_check.json``)."""
    before, last = _h200_runs(root)[-2:]

    def vs(run: dict, m: str) -> float:
        folder = root / "docs" / "data" / "gpu" / run["folder"]
        return _gpu_parts(folder)["bench_optim_780m"]["vs_paper_bf16"][f"spectra-adamw-{m}"]

    return (f"`docs/data/gpu/{last['folder']}/`): `polar` {vs(last, 'polar'):.2f}× the paper's "
            f"bf16 wrapper, `mixed` {vs(last, 'mixed'):.2f}× ({vs(before, 'polar'):.2f}× and "
            f"{vs(before, 'mixed'):.2f}× in the run before, `{before['folder']}/`)")  # fmt: skip


# --------------------------------------------------------------------------- the mixed method


WORDS = {"2": "two", "4": "four"}


def symmetric_gram(root: Path) -> str:
    """One triangle's Gram blocks against one product (``symmetric_gram_cpu[_busy].json``)."""

    def ratios(name: str, dtype: str) -> list[tuple[float, str]]:
        rows = json_of(root, f"docs/data/{name}.json")["rows"]
        out = []
        for r in rows:
            shape = "×".join(map(str, r["shape"][1:]))
            for k, x in r["ratio"].items():
                if r["dtype"] == dtype and k != "full":
                    out.append((x, f"{shape} with {WORDS[k.removeprefix('blocks')]} blocks"))
        return out

    fp32 = ratios("symmetric_gram_cpu", "float32")
    slower = [(x, where) for x, where in fp32 if x > 1]
    rest = [x for x, _ in fp32 if x <= 1] if len(slower) == 1 else [x for x, _ in fp32]
    out = (
        f"in float32 the blocks took {_x_range(rest)} the full product's time at the "
        "optimizer's shapes"
    )
    if len(slower) == 1:
        out += f" ({slower[0][1]}, {_x(slower[0][0])}, the exception)"
    bf16 = [x for x, _ in ratios("symmetric_gram_cpu", "bfloat16")]
    busy = [x for x, _ in ratios("symmetric_gram_cpu_busy", "float32")]
    return (f"{out}, in bf16 {_x_range(bf16)} (`docs/data/symmetric_gram_cpu.json`); run again "
            f"while another job loaded the machine, the float32 blocks took {_x_range(busy)} "
            "(`symmetric_gram_cpu_busy.json`)")  # fmt: skip


# --------------------------------------------------------------------------- speed on the CPU


def amx_rate(root: Path) -> str:
    """The AMX CPU's bf16 rate over float32's (``docs/data/bench_ops_cpu_native_bf16.json``)."""
    r = json_of(root, "docs/data/bench_ops_cpu_native_bf16.json")["matmul_gflops"]
    return f"run at {r['bf16'] / r['fp32']:.1f}× the float32 rate"


def amx_gflops(root: Path) -> str:
    """The matmul rates of the CPU with AMX (``docs/data/bench_ops_cpu_native_bf16.json``)."""
    r = json_of(root, "docs/data/bench_ops_cpu_native_bf16.json")["matmul_gflops"]
    return f"ran at {r['bf16']:.0f} GFLOP/s against {r['fp32']:.0f} in float32"


def recorded_sigma(root: Path) -> str:
    """σ_max/c of the recorded training directions (``docs/data/bench_ops_cpu_recorded.json``)."""
    sig = [c.sigma_over_c for c in ops_cells(root, "bench_ops_cpu_recorded")]
    return f"{min(sig):.1f}–{max(sig):.0f}"


def _124m_flops() -> tuple[dict[tuple[int, int], int], int, int, int]:
    """124M matrices by ``(m, n)``; flops of ``4m²n``, ``G²`` and two bf16 steps (``10m³``)."""
    from spectra_lab.bench.optim import llama_shapes

    mats: dict[tuple[int, int], int] = {}
    for s in llama_shapes():
        if len(s) == 2:
            key = (min(s), max(s))
            mats[key] = mats.get(key, 0) + 1
    gram = sum(k * 4 * m * m * n for (m, n), k in mats.items())
    square = sum(k * 2 * m**3 for (m, _), k in mats.items())
    return mats, gram, square, 5 * square


def native_floor_flops(root: Path) -> str:
    """Float32 flops at the 124M shapes (``llama_shapes``; a count, no file read)."""
    mats, gram, square, _ = _124m_flops()
    m, n = max(mats, key=lambda s: s[1])
    return (f"`4m²n` summed over the {sum(mats.values())} matrices = {gram / 1e9:.0f} GFLOP (the "
            f"{n}×{m} embedding and head {4 * m * m * n / 1e9:.0f} GFLOP each), and `G²` "
            f"({square / 1e9:.0f} GFLOP)")  # fmt: skip


#: The 124M optimizer step on the CPU with bf16 units, by method (``spectra bench optim``).
NATIVE_STEP = "bench_optim_cpu_native_bf16_2threads"


def _native_rows(root: Path, name: str) -> dict[str, dict]:
    return {r["method"]: r for r in json_of(root, f"docs/data/{name}.json")["rows"]}


def _native_floor(root: Path) -> tuple[float, float, float]:
    """The 124M step's floor on the CPU with bf16 units, in seconds: the float32 products at
    the measured float32 rate, two bf16 steps at the bf16 rate, and their sum with AdamW's own
    step (``bench_ops_cpu_native_bf16``, ``bench_optim_cpu_native_bf16_2threads``)."""
    _, gram, square, bf16 = _124m_flops()
    rate = json_of(root, "docs/data/bench_ops_cpu_native_bf16.json")["matmul_gflops"]
    fp32_s, bf16_s = (gram + square) / 1e9 / rate["fp32"], bf16 / 1e9 / rate["bf16"]
    adamw = _native_rows(root, NATIVE_STEP)["torch-adamw"]["step_s"]
    return fp32_s, bf16_s, adamw + fp32_s + bf16_s


def native_floor(root: Path) -> str:
    """The AMX step's floor (``bench_ops_cpu_native_bf16``, ``bench_optim_…native_bf16``)."""
    _, gram, square, bf16 = _124m_flops()
    rate = json_of(root, "docs/data/bench_ops_cpu_native_bf16.json")["matmul_gflops"]
    rows = {m: r["step_s"] for m, r in _native_rows(root, NATIVE_STEP).items()}
    fp32_s, bf16_s, floor = _native_floor(root)
    paper, rest = rows["paper-wrap-bf16"], rows["spectra-adamw"] - floor
    return (f"At the float32 rate measured here ({rate['fp32']:.0f} GFLOP/s, one 512³ product "
            f"on two threads) those {(gram + square) / 1e9:.0f} GFLOP take {fp32_s:.2f} s; with "
            f"AdamW's own step ({rows['torch-adamw']:.2f} s here) and the fewest bf16 steps any "
            f"input takes (two: {bf16 / 1e9:.0f} GFLOP, {bf16_s:.2f} s at the measured "
            f"{rate['bf16']:.0f} GFLOP/s) the floor is {floor:.2f} s, {floor / paper:.2f}× the "
            f"wrapper's {paper:.2f} s, before any exact step, small operation or finite check, "
            f"which take about {rest:.1f} s now")  # fmt: skip


def split_cost(root: Path) -> str:
    """``polar_bf16``'s median cost (``docs/data/bench_ops_cpu_recorded.json``)."""
    cells = ops_cells(root, "bench_ops_cpu_recorded")

    def med(m: str) -> float:
        return statistics.median(c.vs_paper_bf16 for c in cells if c.method == m)

    return (
        f"about {med('polar_bf16') / med('polar'):.0f}× `polar` here "
        f"({med('polar_bf16'):.2f}× the emulated paper bf16 run on the recorded inputs)"
    )


# --------------------------------------------------------------------------- H100 model


def model_assumptions(root: Path) -> str:
    """The H100 model's efficiency, peaks and launch cost (``docs/data/gpu_model_h100.json``)."""
    model = json_of(root, "docs/data/gpu_model_h100.json")
    peak = model["peak_tflops"]
    fp = (
        f"float32 and float64 {peak['fp32']:.0f}"
        if peak["fp32"] == peak["fp64"]
        else f"float32 {peak['fp32']:.0f}, float64 {peak['fp64']:.0f}"
    )
    return (
        f"{model['efficiency']:.0%} of NVIDIA's dense peaks (bf16 {peak['bf16']:.0f} "
        f"TFLOP/s, {fp}) and {model['launch_us']:.0f} µs per eager launch"
    )


def split_peak_gain(root: Path) -> str:
    """Three bf16 products against a float32 one at peak (``docs/data/gpu_model_h100.json``)."""
    peak = json_of(root, "docs/data/gpu_model_h100.json")["peak_tflops"]
    return f"about {peak['bf16'] / peak['fp32'] / 3:.0f}× cheaper"


def model_mixed(root: Path) -> str:
    """``mixed`` in the H100 model (``docs/data/gpu_model_h100.json``)."""
    a, b = (_x_range(_model_rows(root, "mixed", m)) for m in ("124m", "780m"))
    return f"{a} at 124M and {b} at 780M"


def model_polar_124m(root: Path) -> str:
    """Float32 ``polar`` at 124M in the H100 model (``docs/data/gpu_model_h100.json``)."""
    return f"{value_range(_model_rows(root, 'polar-fp32', '124m'), '.1f')}×"


def model_polar_780m(root: Path) -> str:
    """Float32 ``polar`` at 780M in the H100 model (``docs/data/gpu_model_h100.json``)."""
    return f"{value_range(_model_rows(root, 'polar-fp32', '780m'), '.1f')}×"


def model_split(root: Path) -> str:
    """Split-bf16 ``polar`` in the H100 model (``docs/data/gpu_model_h100.json``)."""
    a, b = (_model_rows(root, "polar-bf16x3", m)[0] for m in ("124m", "780m"))
    return f"{a:.2f}× (124M) and {b:.2f}× (780M)"


def model_vs_muon(root: Path) -> str:
    """The CUDA default at 780M (``mixed`` by split bf16 products) against ``torch.optim.Muon``
    in the H100 model, at σ_max/c = 30 (``docs/data/gpu_model_h100.json``)."""
    rows = json_of(root, "docs/data/gpu_model_h100.json")["rows"]
    pick = {r["method"]: r for r in rows if r["model"] == "780m" and r["sigma_over_c"] == 30}
    split, muon = pick["mixed-bf16x3"], pick["torch-muon"]
    return (
        f"{split['ms'] / muon['ms']:.2f}× `torch-muon` ({split['ms']:.0f} against "
        f"{muon['ms']:.0f} ms: {split['gflop'] / muon['gflop']:.2f}× its flops, "
        f"{split['launches']:.0f} against {muon['launches']:.0f} launches)"
    )


def model_capturable(root: Path) -> str:
    """The capturable ``mixed`` rows of the H100 model at 124M and σ_max/c = 30 beside the
    default call that reads α (``docs/data/gpu_model_h100.json``)."""
    rows = json_of(root, "docs/data/gpu_model_h100.json")["rows"]
    pick = {r["method"]: r for r in rows if r["model"] == "124m" and r["sigma_over_c"] == 30}
    ms = {name: f"{pick[name]['ms']:.0f} ms" for name in pick}
    return (
        f"{ms['mixed-capturable']} with float32 products, {ms['mixed-capturable-bf16x6']} by "
        f"split products of three parts and {ms['mixed-capturable-bf16x3-r100']} of two under "
        f"`ratio_bound=100`, against {ms['mixed']} for the default call that reads α"
    )


# --------------------------------------------------------------------------- soft clip vs orth


def _ssc(root: Path) -> dict[str, dict[int, Any]]:
    """``docs/data/bench_ssc_vs_orth_cpu.json``'s cells by method and size."""
    out: dict[str, dict[int, Any]] = {}
    for c in ops_cells(root, "bench_ssc_vs_orth_cpu"):
        out.setdefault(c.method, {})[int(c.shape.split("x")[0])] = c
    return out


def _ssc_ratio(root: Path, a: str, b: str) -> list[float]:
    cells = _ssc(root)
    return [cells[a][n].time_ms / cells[b][n].time_ms for n in sorted(cells[a])]


def ssc_rates(root: Path) -> str:
    """The run's matmul rates (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    r = json_of(root, "docs/data/bench_ssc_vs_orth_cpu.json")["matmul_gflops"]
    return f"reports {r['bf16']:.0f} GFLOP/s against {r['fp32']:.0f} in float32"


def ssc_muon_bf16(root: Path) -> str:
    """bf16 Muon's time over float32 Muon's (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    ratio = _ssc_ratio(root, "orth_muon", "orth_muon_fp32")
    return f"its 5 steps take {_x_range(ratio)} the time of the same steps in float32"


def ssc_like(root: Path) -> str:
    """``paper_fp32`` against ``orth_muon_fp32`` (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    return f"{_x_range(_ssc_ratio(root, 'paper_fp32', 'orth_muon_fp32'))} the time"


def ssc_auto(root: Path) -> str:
    """``auto``'s time ratios and errors (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    cells = _ssc(root)
    orth = _ssc_ratio(root, "auto", "orth_muon_fp32")
    falling = ", its ratio falling with `n`" if orth == sorted(orth, reverse=True) else ""
    paper = _ssc_ratio(root, "auto", "paper_fp32")
    auto = [c.rel_err for c in cells["auto"].values()]
    alg1 = [c.rel_err for m in ("paper_fp32", "paper_bf16") for c in cells[m].values()]
    return (f"{_x_range(orth)} the float32 orthogonalization{falling}; it is also "
            f"{_x_range(paper)} the float32 Algorithm 1. Its error against the float64 SVD is "
            f"{sci(min(auto))}–{sci(max(auto))}, while Algorithm 1 is off by "
            f"{value_range(alg1)}")  # fmt: skip


def ssc_muon_error(root: Path) -> str:
    """5 Muon steps against ``UVᵀ`` (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    cells = _ssc(root)
    err = [c.rel_err for m in ("orth_muon", "orth_muon_fp32") for c in cells[m].values()]
    return f"5 Muon steps are {value_range(err)} from"


def ssc_budget(root: Path) -> str:
    """The cells ``--budget`` cut short (``docs/data/bench_ssc_vs_orth_cpu.json``)."""
    short = [c for c in ops_cells(root, "bench_ssc_vs_orth_cpu") if c.runs == 1]
    if not short:
        return "Every cell is the median of 3 (`--budget 10` cut none short)"
    cut = "; ".join(f"`{c.method}` at {c.shape.split('x')[0]} after one run "
                    f"({c.time_ms / 1e3:.0f} s)" for c in short)  # fmt: skip
    return f"`--budget 10` stopped {cut}; every other cell is the median of 3"


def native_split(root: Path) -> str:
    """Where ``auto`` beats the paper's bf16 run on the CPU with bf16 units, by input
    (``docs/data/bench_ops_cpu_native_bf16.json``, float32 input)."""
    auto = [c for c in ops_cells(root, "bench_ops_cpu_native_bf16")
            if c.method == "auto" and c.dtype == "fp32"]  # fmt: skip
    recorded = [c for c in auto if "@" in c.input]
    sign = sorted((c for c in auto if c.input == "sign"),
                  key=lambda c: [int(x) for x in c.shape.split("x")])  # fmt: skip

    def shapes(cells: list) -> str:
        names = [c.shape.replace("x", "×") for c in cells]
        return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]

    faster = [c for c in sign if c.vs_paper_bf16 <= 1]
    slower = [c for c in sign if c.vs_paper_bf16 > 1]
    rec = sum(c.vs_paper_bf16 <= 1 for c in recorded)
    text = ("on every recorded direction" if rec == len(recorded)
            else f"on {rec} of the {len(recorded)} recorded directions")  # fmt: skip
    if faster:
        text += f" and on the sign input at {shapes(faster)}"
    return text + (f", slower at {shapes(slower)} and on the spikes" if slower
                   else ", slower on the spikes")  # fmt: skip


def native_target(root: Path) -> str:
    """The default's 124M step against the ``≤ 0.5×`` target, and whether the float32 products
    alone rule it out (``bench_optim_cpu_native_bf16_2threads``, ``bench_ops_cpu_native_bf16``)."""
    rows = _native_rows(root, NATIVE_STEP)
    ratio = rows["spectra-adamw"]["step_s"] / rows["paper-wrap-bf16"]["step_s"]
    floor = _native_floor(root)[2] / rows["paper-wrap-bf16"]["step_s"]
    met = "That meets" if ratio <= 0.5 else "That is not"
    reach = ("**`0.5×` is out of reach on this CPU at this accuracy**" if floor > 0.5 else
             "the float32 products alone do not put `0.5×` out of reach on this CPU (the floor "
             "below): what stands between is the rest of the step")  # fmt: skip
    return f"{met} the `≤ 0.5×` asked of it — and {reach}"


def native_mixed_vs_eigh(root: Path) -> str:
    """``mixed`` (the default) against the exact ``eigh`` in the optimizer step at the main
    job's shapes and at the 124M ones (``bench_optim_main_job_native_bf16``, ``…_2threads``)."""
    small = _native_rows(root, "bench_optim_main_job_native_bf16")
    large = _native_rows(root, NATIVE_STEP)

    def compare(rows: dict, where: str, unit: float, fmt: str) -> str:
        m, e = rows["spectra-adamw"]["step_s"] * unit, rows["spectra-adamw-eigh"]["step_s"] * unit
        who = "`mixed`" if m <= e else "`eigh`"
        a, b = (m, e) if m <= e else (e, m)
        return f"{where} {who} took less, {a:{fmt}} against {b:{fmt}}"

    where = "at the main job's shapes"
    return (
        f"{compare(small, where, 1e3, '.0f')} ms a step; "
        f"{compare(large, 'at the 124M shapes', 1, '.2f')} s"
    )


def native_1_05(root: Path) -> str:
    """The main job's step against the ``1.05×`` target by optimizer time and by the totals
    (``docs/data/bench_step_main_job_native_bf16_2threads.json``)."""
    rows = {r["name"]: r for r in json_of(
        root, "docs/data/bench_step_main_job_native_bf16_2threads.json")["rows"]}  # fmt: skip
    a, s = rows["adamw"], rows["spectra-adamw"]
    by_opt = 1 + (s["optimizer_ms"] - a["optimizer_ms"]) / a["total_ms"]
    by_total = s["total_ms"] / a["total_ms"]
    if by_opt <= 1.05:
        return "**The `1.05×` target is met** by optimizer time" + (
            ""
            if by_total <= 1.05
            else " (not by the totals, which carry the forward and backward passes' spread)"
        )
    return "**The `1.05×` target is not met** here"


def main_job_wrapper(root: Path) -> str:
    """The default's step at the main job's shapes over the paper's bf16 wrapper's
    (``docs/data/bench_optim_main_job_native_bf16.json``)."""
    rows = _native_rows(root, "bench_optim_main_job_native_bf16")
    ratio = rows["spectra-adamw"]["step_s"] / rows["paper-wrap-bf16"]["step_s"]
    return f"takes {ratio:.2f}× the paper's bf16 wrapper's time there"


OPERATORS_PHRASES: dict[str, Callable[[Path], str]] = {
    "data:operators-native-target": native_target,
    "data:operators-native-mixed-vs-eigh": native_mixed_vs_eigh,
    "data:operators-native-1-05": native_1_05,
    "data:operators-main-job-wrapper": main_job_wrapper,
    "data:operators-native-split": native_split,
    "data:operators-mixed-spike-error": mixed_spike_error,
    "data:operators-main-job-threads": main_job_threads,
    "data:operators-gpu-summary": gpu_summary,
    "data:operators-h200-mixed-step": h200_mixed_step,
    "data:operators-h200-polar-error": h200_polar_error,
    "data:operators-h200-mixed-vs-polar": h200_mixed_vs_polar,
    "data:operators-h200-mixed-short": h200_mixed_short,
    "data:operators-h100-mixed": h100_mixed,
    "data:operators-h200-780m": h200_780m,
    "data:operators-cuda-default": cuda_default,
    "data:operators-cuda-split-rule": cuda_split_rule,
    "data:operators-symmetric-gram": symmetric_gram,
    "data:operators-amx-rate": amx_rate,
    "data:operators-amx-gflops": amx_gflops,
    "data:operators-recorded-sigma": recorded_sigma,
    "data:operators-native-floor-flops": native_floor_flops,
    "data:operators-native-floor": native_floor,
    "data:operators-split-cost": split_cost,
    "data:operators-model-assumptions": model_assumptions,
    "data:operators-split-peak-gain": split_peak_gain,
    "data:operators-model-mixed": model_mixed,
    "data:operators-model-polar-124m": model_polar_124m,
    "data:operators-model-polar-780m": model_polar_780m,
    "data:operators-model-split": model_split,
    "data:operators-model-vs-muon": model_vs_muon,
    "data:operators-model-capturable": model_capturable,
    "data:operators-ssc-rates": ssc_rates,
    "data:operators-ssc-muon-bf16": ssc_muon_bf16,
    "data:operators-ssc-like": ssc_like,
    "data:operators-ssc-auto": ssc_auto,
    "data:operators-ssc-muon-error": ssc_muon_error,
    "data:operators-ssc-budget": ssc_budget,
}
