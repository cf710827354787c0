"""What renders each generated block of README.md and docs/ (outside the study's): one function
per block, reading the files under the source tree's root (``docs/data/``, ``results/``) and
writing the block's Markdown. :data:`BLOCKS` maps each block's key to its function;
:mod:`spectra_lab.pages` finds the blocks in the pages, writes and checks them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.bench import (
    bench_optim,
    bench_step,
    dist_timing,
    dist_traffic,
    dist_traffic_model,
    dist_volume,
    eigh_errors,
    gpu_model,
    mixed_errors,
    native_step,
    ops,
    ops_in_short,
    ops_misses,
    ops_native,
    ops_native_medians,
    ops_synthetic,
    orth_bands,
    polar_errors,
    polar_flops,
    split_errors,
    state_memory,
    step_ratio_main_job,
    step_ratio_native,
)
from spectra_lab.blocks.cpu_step import CPU_STEP
from spectra_lab.blocks.gpu import (
    gpu_after_ops_modules,
    gpu_bars,
    gpu_bars_h200,
    gpu_h100,
    gpu_memory_model,
    gpu_ops,
    gpu_peak_after_free,
    gpu_peaks,
    gpu_peers,
    gpu_runs,
    gpu_summary,
    gpu_tests,
    gpu_train,
)
from spectra_lab.blocks.harness_phrases import HARNESS_PHRASES
from spectra_lab.blocks.library_phrases import LIBRARY_PHRASES
from spectra_lab.blocks.operators_phrases import OPERATORS_PHRASES
from spectra_lab.blocks.phrases import PHRASES
from spectra_lab.blocks.runs import (
    coord_growth,
    coord_table,
    diagnostics_gradients,
    evaluation,
    lr_transfer,
    machines,
    main_job_chebyshev,
    main_job_mixed,
    main_job_paired,
    main_job_table,
    monitor_cost,
    plan_h100x4,
    synth_frobenius,
    synth_fw,
    synth_seeds,
    synth_spikes,
    synth_stochastic,
    weight_norms,
)

#: Every block outside the study, by key: what renders it from the files under the root.
BLOCKS: dict[str, Callable[[Path], str]] = {
    "gpu:runs": gpu_runs,
    "gpu:summary": gpu_summary,
    "data:machines": machines,
    "data:main-job": main_job_table,
    "data:main-job-paired": main_job_paired,
    "data:main-job-mixed": main_job_mixed,
    "data:main-job-chebyshev": main_job_chebyshev,
    "data:gpu-model-h100": gpu_model,
    "data:bench-dist-timing": dist_timing,
    "data:diagnostics-gradients": diagnostics_gradients,
    **PHRASES,
    **OPERATORS_PHRASES,
    **CPU_STEP,
    **LIBRARY_PHRASES,
    **HARNESS_PHRASES,
    "data:weight-norms": weight_norms,
    "data:monitor-cost": monitor_cost,
    "data:evaluation": evaluation,
    "data:synth-spikes": synth_spikes,
    "data:synth-fw": synth_fw,
    "data:synth-seeds": synth_seeds,
    "data:synth-stochastic": synth_stochastic,
    "data:synth-frobenius": synth_frobenius,
    "data:mup-lr-transfer": lr_transfer,
    "data:plan-h100x4": plan_h100x4,
    "data:coord-check": coord_table,
    "data:coord-growth": coord_growth,
    "data:bench-ops-native": ops_native,
    "data:bench-ops-in-short": ops_in_short,
    "data:bench-ops-synthetic": ops_synthetic,
    "data:polar-flops": polar_flops,
    "data:mixed-errors": mixed_errors,
    "data:polar-errors": polar_errors,
    "data:eigh-errors": eigh_errors,
    "data:split-errors": split_errors,
    "data:orth-bands": orth_bands,
    "data:state-memory": state_memory,
    "data:native-step": native_step,
    "data:bench-ops-misses": ops_misses,
    "data:gpu-peaks": gpu_peaks,
    "data:step-ratio-native": step_ratio_native,
    "data:step-ratio-main-job": step_ratio_main_job("main_job_step_ratio"),
    "data:step-ratio-main-job-epyc": step_ratio_main_job("main_job_step_ratio_avx2_epyc"),
    "gpu:ops": gpu_ops,
    "gpu:peers": gpu_peers,
    "gpu:tests": gpu_tests,
    "gpu:train": gpu_train,
    "gpu:h100": gpu_h100,
    "gpu:bars": gpu_bars,
    "gpu:bars-h200": gpu_bars_h200,
    "gpu:peak-after-free": gpu_peak_after_free,
    "gpu:memory-model": gpu_memory_model,
    "gpu:after-ops-modules": gpu_after_ops_modules,
    "data:bench-ops-native-medians": ops_native_medians,
    "data:bench-dist-volume": dist_volume,
    "data:bench-dist-traffic": dist_traffic,
    "data:bench-dist-traffic-model": dist_traffic_model,
    **{f"data:{name.replace('_', '-')}": bench_optim(name) for name in (
        "bench_optim_cpu_2threads", "bench_optim_memory_cpu_2threads",
        "bench_optim_memory_cpu_1thread", "bench_optim_peers_cpu_2threads",
        "bench_optim_cpu_native_bf16_2threads", "bench_optim_main_job_native_bf16")},
    "data:bench-ops-cpu": ops("bench_ops_cpu", "cells"),
    **{f"data:{name.replace('_', '-')}-summary": ops(name, "summary") for name in (
        "bench_ops_cpu", "bench_ops_cpu_recorded")},
    "data:bench-ssc-vs-orth-cpu": ops("bench_ssc_vs_orth_cpu", "sizes"),
    **{f"data:{name.replace('_', '-')}": bench_step(name) for name in (
        "bench_step_main_job_2threads", "bench_step_main_job_1thread",
        "bench_step_main_job_native_bf16_2threads")},
}  # fmt: skip
