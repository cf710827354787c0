"""Fixtures shared by the test modules."""

from __future__ import annotations

import importlib

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run the test with one torch thread (modules opt in with ``pytestmark``).

    The test machine is shared; OpenMP threads fighting over its cores slow the small steps of
    the tests down by orders of magnitude.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def char_tokenizer(monkeypatch):
    """Make ``spectra_lab.data.load_tokenizer`` return a one-character-per-token-id tokenizer
    (ids 0.. are the characters from '0'), so that sampling needs no prepared tokenizer."""

    class Chars:
        vocab_size = 64

        def __init__(self, dataset_dir=None) -> None:
            self.dataset_dir = dataset_dir

        def encode(self, text):
            return [ord(c) - 48 for c in text]

        def decode(self, ids):
            return "".join(chr(48 + i) for i in ids)

    monkeypatch.setattr(importlib.import_module("spectra_lab.data"), "load_tokenizer", Chars)
    return Chars


@pytest.fixture(scope="session")
def tiny_state():
    """``spectra_lab.bench.memory.measure(name, "tiny")``, measured once a session per optimizer:
    SOAP's first step takes an eigendecomposition of the 4096-row embedding's factor, which
    several tests would otherwise each pay for."""
    import functools

    from spectra_lab.bench.memory import measure

    return functools.cache(lambda name: measure(name, "tiny"))
