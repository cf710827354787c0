"""``spectra export RUN --format hf``: the run as a Hugging Face ``LlamaForCausalLM``.

The references are independent: ``transformers``' own Llama, loaded from the exported folder
with ``from_pretrained``, against spectra's model on the same tokens; ``AutoTokenizer`` against
the harness's tokenizer on the validation text. transformers is a dev extra (``make test``
installs it); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.data.format import begin_dataset, write_dataset
from spectra_lab.data.tokenizers import BPE_FILE, BPETokenizer, ByteTokenizer
from spectra_lab.model import Llama, ModelConfig
from spectra_lab.runs.checkpoint import checkpoint_path, write_checkpoint

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (a dev extra: make test installs it)"
)
pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
VAL = "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n"


def make_run(root: Path, tokenizer: str = "bpe", **model: object) -> Path:
    """A run directory whose checkpoint holds a tiny perturbed model and its dataset."""
    data = begin_dataset(root / "data")
    tok = BPETokenizer.train([TRAIN * 4, VAL], 300) if tokenizer == "bpe" else ByteTokenizer()
    if tokenizer == "bpe":
        tok.save(data / BPE_FILE)
    write_dataset(data, [("train", TRAIN), ("val", VAL)], tok, meta={"name": "tiny"})
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, seq_len=64,
                      **model)  # fmt: skip
    net = Llama(cfg)
    with torch.no_grad():  # away from the initialisation, so that every weight matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {"model_config": cfg.to_dict(), "model": net.state_dict(), "dataset_dir": str(data),
             "step": 1}  # fmt: skip
    run = root / "run"
    write_checkpoint(checkpoint_path(run, 1), state)
    return run


def exported(run: Path, out: Path, capsys) -> Path:
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    return out


@pytest.mark.parametrize(
    "model",
    [{}, {"mup_base_width": 32}, {"tie_embeddings": True}],
    ids=["standard", "mup", "tied"],
)
def test_transformers_llama_gives_the_same_logits_and_tokens(tmp_path, capsys, model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spectra_lab.data import load_tokenizer
    from spectra_lab.runs.model import load_model

    run = make_run(tmp_path, **model)
    out = exported(run, tmp_path / "hf", capsys)
    ours, state = load_model(run)
    tok = load_tokenizer(state["dataset_dir"])
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    ids = tok.encode(VAL)
    assert hf_tok(VAL)["input_ids"] == ids
    assert hf_tok.decode(ids) == VAL
    x = torch.tensor([ids[:64]])
    with torch.no_grad():
        a, b = ours(x)[0], hf(x).logits
    assert (a - b).abs().max().item() <= 1e-4 * a.abs().max().item()
    greedy = hf.generate(x[:, :8], max_new_tokens=6, do_sample=False)
    assert greedy.shape == (1, 14)
    with torch.no_grad():  # the first generated token is our own argmax
        assert greedy[0, 8].item() == ours(x[:, :8])[0][0, -1].argmax().item()


def test_the_byte_tokenizer_exports_as_bytes(tmp_path, capsys):
    from transformers import AutoTokenizer

    out = exported(make_run(tmp_path, tokenizer="bytes"), tmp_path / "hf", capsys)
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = VAL + "é, ü and 字"
    assert hf_tok(text)["input_ids"] == list(text.encode("utf-8"))
    assert hf_tok.decode(list(text.encode("utf-8"))) == text


def test_config_names_the_llama_shape(tmp_path, capsys):
    assert main(["export", str(make_run(tmp_path)), "--out", str(tmp_path / "hf")]) == 0
    out = tmp_path / "hf"
    # a corpus without speeches has no offline task to write beside the model
    assert "no shakespeare_lambada task in the export" in capsys.readouterr().out
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]  # not safetensors' own 0600
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (64, 2, 4)
    assert {p.name for p in out.iterdir()} == {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    }  # fmt: skip


def test_refusals_are_one_line(tmp_path, capsys):
    run = make_run(tmp_path / "a", mup_base_width=32, tie_embeddings=True)
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tied embeddings" in err
    assert not (tmp_path / "hf").exists()  # nothing written
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    assert main(["export", str(make_run(tmp_path / "b")), "--out", str(tmp_path / "full")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err


def test_gpt2_without_its_cached_files_is_one_line(tmp_path, monkeypatch):
    from spectra_lab.errors import CLIError
    from spectra_lab.runs.export import write_tokenizer

    class GPT2:
        name = "gpt2"

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(CLIError, match="not in tiktoken's cache"):
        write_tokenizer(GPT2(), tmp_path, 64)


def documented_recipe() -> list[str]:
    """The lines of docs/evaluation.md's recipe for lm-eval's own command line on an export
    (continuation lines joined)."""
    text = (Path(__file__).parents[1] / "docs" / "evaluation.md").read_text()
    section = text.split("## lm-eval's own command line: a Hugging Face export", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ").splitlines()


def test_lm_evals_own_cli_scores_a_fresh_export_as_the_docs_say(tmp_path, capsys, monkeypatch):
    # docs/evaluation.md's recipe as written (`spectra export`, then `lm_eval --model hf` with
    # the export's tasks folder) on a run never scored before, against `spectra eval`
    import shlex
    import subprocess
    import sys

    pytest.importorskip("lm_eval", reason="lm-eval is not installed (the eval extra)")
    from test_eval import PLAY, tiny_model

    data = begin_dataset(tmp_path / "data")
    tok = BPETokenizer.train([PLAY * 3, "some training text\n"], 300)
    tok.save(data / BPE_FILE)
    docs = [("train", "some training text\n"), ("val", PLAY), ("val", PLAY.replace("foul", "fell"))]
    write_dataset(data, docs, tok, meta={"name": "tiny-play"})
    model = tiny_model(tok.vocab_size, seq_len=64)
    state = {"model_config": model.cfg.to_dict(), "model": model.state_dict(),
             "dataset_dir": str(data), "step": 1}  # fmt: skip
    run = tmp_path / "runs" / "spectra"
    write_checkpoint(checkpoint_path(run, 1), state)
    monkeypatch.chdir(tmp_path)  # the recipe's paths are relative
    export, score, spectra_hf = documented_recipe()
    argv = shlex.split(export)
    assert argv[0] == "spectra" and main(argv[1:]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "shakespeare_lambada: 4 passages in runs/spectra-hf/tasks" in printed
    assert not (run / "eval").exists()  # nothing of `spectra eval` is needed
    cmd = shlex.split(score)
    assert cmd[0] == "lm_eval"
    cmd = [sys.executable, "-m", "lm_eval", *cmd[1:], "--batch_size", "2",
           "--output_path", str(tmp_path / "lm_eval")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = (tmp_path / "lm_eval").rglob("results_*.json")
    theirs = json.loads(result.read_text())["results"]["shakespeare_lambada"]
    assert main(["eval", str(run), "--tasks", "shakespeare_lambada", "--batch-size", "2"]) == 0
    mine = json.loads((run / "eval" / "results.json").read_text())["results"]
    mine = mine["shakespeare_lambada"]
    assert theirs["acc,none"] == mine["acc,none"]
    assert theirs["perplexity,none"] == pytest.approx(mine["perplexity,none"], rel=1e-4)
    # spectra eval --hf: the same export and lm-eval's hf model, from spectra's command
    assert shlex.split(spectra_hf, comments=True)[1:] == [
        "eval", "runs/spectra", "--tasks", "shakespeare_lambada", "--hf"
    ]  # fmt: skip
    argv = ["eval", str(run), "--tasks", "shakespeare_lambada", "--batch-size", "2", "--hf"]
    assert main(argv) == 0
    hf = json.loads((run / "eval" / "results.json").read_text())["results"]["shakespeare_lambada"]
    assert hf["acc,none"] == mine["acc,none"]
    assert hf["perplexity,none"] == pytest.approx(mine["perplexity,none"], rel=1e-4)
    assert (run / "eval" / "hf" / "model.safetensors").is_file()
