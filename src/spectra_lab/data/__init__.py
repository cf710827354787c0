"""Corpora, tokenizers and batches for the harness.

``prepare(name, out_dir, ...)`` writes a dataset directory (``train.bin``, ``val.bin``,
``meta.json``); ``TokenDataset`` and ``BatchSampler`` read it back; ``load_tokenizer``
returns the tokenizer it was written with.
"""

from spectra_lab.data.errors import DataError
from spectra_lab.data.format import check_dataset, load_tokenizer, read_meta
from spectra_lab.data.loader import BatchSampler, TokenDataset, iter_eval_batches
from spectra_lab.data.paths import default_cache_dir, default_dataset_dir
from spectra_lab.data.prepare import DATASETS, prepare, training_dataset
from spectra_lab.data.tokenizers import TOKENIZERS, get_tokenizer

__all__ = [
    "DATASETS",
    "TOKENIZERS",
    "BatchSampler",
    "DataError",
    "TokenDataset",
    "check_dataset",
    "default_cache_dir",
    "default_dataset_dir",
    "get_tokenizer",
    "iter_eval_batches",
    "load_tokenizer",
    "prepare",
    "read_meta",
    "training_dataset",
]
