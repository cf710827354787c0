"""A damaged or missing prepared dataset, tokenizer or input file: found when it is opened,
reported in one line that names the file and the command that writes it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.data import DataError, TokenDataset, check_dataset, load_tokenizer
from spectra_lab.data.format import dataset_is_complete
from spectra_lab.data.hub import prepare_documents
from spectra_lab.data.prepare import training_dataset
from spectra_lab.data.request import CorpusRequest
from spectra_lab.model import Llama, ModelConfig
from spectra_lab.runs.checkpoint import checkpoint_path, write_checkpoint

TEXTS = [f"document {i}: " + "to be or not to be, that is the question. " * 8 for i in range(40)]


@pytest.fixture
def bpe_dataset(tmp_path) -> Path:
    """A small prepared dataset with a trained BPE tokenizer (``tokenizer.json``)."""
    request = CorpusRequest(
        name="text", tokenizer="bpe", vocab_size=300, val_fraction=0.1,
        source={"files": [{"path": "/data/plays.jsonl"}]},
    )  # fmt: skip
    return prepare_documents(tmp_path / "ds", TEXTS, request)


def one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    return err


def train_argv(dataset: Path | str, out: Path) -> list[str]:
    return ["train", "--dataset", str(dataset), "--preset", "tiny", "--steps", "1",
            "--out", str(out), "--no-progress"]  # fmt: skip


def test_a_good_dataset_passes_the_checks(bpe_dataset):
    meta = check_dataset(bpe_dataset)
    assert meta["tokenizer"] == "bpe" and dataset_is_complete(bpe_dataset)
    assert training_dataset(str(bpe_dataset), "bpe", 4096, None) == bpe_dataset


def test_a_missing_val_bin_names_the_file_and_the_command(bpe_dataset, tmp_path, capsys):
    (bpe_dataset / "val.bin").unlink()
    with pytest.raises(DataError, match=r"val\.bin is missing; prepare it again: spectra "):
        check_dataset(bpe_dataset)
    err = one_line_error(capsys, main(train_argv(bpe_dataset, tmp_path / "run")))
    assert f"{bpe_dataset / 'val.bin'} is missing" in err
    # the command that wrote it: the request's corpus, tokenizer and inputs, and --force
    assert (
        "spectra prepare-data --dataset text --tokenizer bpe --vocab-size 300 "
        f"--input /data/plays.jsonl --out {bpe_dataset} --force"
    ) in err
    assert not dataset_is_complete(bpe_dataset)
    with pytest.raises(DataError, match=r"val\.bin is missing"):
        TokenDataset(bpe_dataset / "val.bin", 8)


def test_a_truncated_token_file_is_refused_before_training(bpe_dataset, tmp_path, capsys):
    with open(bpe_dataset / "train.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 1)  # half a uint16 token short
    err = one_line_error(capsys, main(train_argv(bpe_dataset, tmp_path / "run")))
    assert "train.bin is damaged" in err and "uint16 tokens" in err and "--force" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        TokenDataset(bpe_dataset / "train.bin", 8)


@pytest.mark.parametrize(
    "damage", ['{"version": "1.0", "trunc', "{}", "foreign"], ids=["cut", "empty", "foreign"]
)
def test_a_damaged_tokenizer_is_refused_when_training_starts(bpe_dataset, tmp_path, capsys, damage):
    path = bpe_dataset / "tokenizer.json"
    if damage == "foreign":  # another dataset's tokenizer: a smaller vocabulary
        from spectra_lab.data.tokenizers import BPETokenizer

        BPETokenizer.train(TEXTS, 280).save(path)
    else:
        path.write_text(damage)
    err = one_line_error(capsys, main(train_argv(bpe_dataset, tmp_path / "run")))
    assert f"{path} " in err and "prepare it again: spectra prepare-data" in err
    with pytest.raises(DataError, match=r"tokenizer\.json"):
        load_tokenizer(bpe_dataset)
    assert not dataset_is_complete(bpe_dataset)  # so prepare-data writes it again


def test_sample_and_export_name_a_damaged_tokenizer(bpe_dataset, tmp_path, capsys):
    tok = load_tokenizer(bpe_dataset)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, seq_len=16)
    torch.manual_seed(0)
    state = {"model_config": cfg.to_dict(), "model": Llama(cfg).state_dict(),
             "dataset_dir": str(bpe_dataset), "step": 1}  # fmt: skip
    run = tmp_path / "run"
    write_checkpoint(checkpoint_path(run, 1), state)
    (bpe_dataset / "tokenizer.json").write_text('{"model": {"vocab": ')
    for argv in (["sample", "--ckpt", str(run), "--tokens", "2"],
                 ["export", str(run), "--out", str(tmp_path / "hf")]):  # fmt: skip
        err = one_line_error(capsys, main(argv))
        assert "tokenizer.json is damaged (EOF while parsing" in err and "--force" in err


def test_a_dataset_path_that_does_not_exist_says_so(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "ds"
    err = one_line_error(capsys, main(train_argv(missing, tmp_path / "run")))
    assert f"the dataset path {missing} does not exist" in err
    assert f"spectra prepare-data --out {missing}" in err and "unknown dataset" not in err
    (tmp_path / "half").mkdir()
    err = one_line_error(capsys, main(train_argv(tmp_path / "half", tmp_path / "run")))
    assert "holds no meta.json" in err
    err = one_line_error(capsys, main(train_argv("wiki", tmp_path / "run")))
    assert "unknown dataset 'wiki'" in err  # a name is still a name


def test_a_damaged_meta_json_is_one_line(bpe_dataset):
    (bpe_dataset / "meta.json").write_text('{"vocab_size": ')
    with pytest.raises(DataError, match=r"meta\.json is damaged \(Expecting value"):
        check_dataset(bpe_dataset)
    (bpe_dataset / "meta.json").write_text(json.dumps({"vocab_size": "many"}))
    with pytest.raises(DataError, match=r"meta\.json is damaged \(its vocab_size\)"):
        check_dataset(bpe_dataset)


# --------------------------------------------------------------------------- prepare-data


def test_prepare_data_refuses_bad_inputs_in_one_line(tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    text = ["prepare-data", "--dataset", "text", "--tokenizer", "bytes"]
    cases = [
        ([*text, "--input", str(tmp_path / "latin1.txt"), "--out", str(tmp_path / "a")],
         "latin1.txt: not UTF-8 text (byte 3 of the text is 0xe9); convert it to UTF-8"),
        ([*text, "--input", str(tmp_path / "folder"), "--out", str(tmp_path / "b")],
         "is a folder; give the files in it"),
        ([*text, "--input", str(tmp_path / "docs.jsonl"), "--out", str(tmp_path / "file")],
         "is a file; give a folder for the dataset"),
        ([*text, "--input", str(tmp_path / "docs.jsonl"), "--tokens", "5",
          "--out", str(tmp_path / "c")], "give a larger token budget than 5 (--tokens)"),
        (["prepare-data", "--vocab-size", "0", "--out", str(tmp_path / "d")],
         "--vocab-size must be an int >= 257"),
    ]  # fmt: skip
    for argv, needle in cases:
        code, err = main(argv), capsys.readouterr().err
        last = err.split("\n")[-2]  # after the tokenizing bar, if it started
        assert code == 2 and last.startswith("spectra prepare-data: error: "), err
        assert needle in last and "Traceback" not in err, err
    assert not (tmp_path / "d").exists()  # refused before anything is fetched or written
