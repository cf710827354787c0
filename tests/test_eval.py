"""Downstream evaluation: the lm-eval adapter against log-probs computed by hand, lm-eval's
own evaluator on a hand-made task, the offline task's build, and ``spectra eval``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval")

import lm_eval
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from spectra_lab.cli import main
from spectra_lab.data.format import begin_dataset, write_dataset
from spectra_lab.data.tokenizers import ByteTokenizer
from spectra_lab.eval.adapter import SpectraLM
from spectra_lab.eval.tasks import build_offline_task, build_passages
from spectra_lab.model import Llama, model_config
from spectra_lab.runs.checkpoint import checkpoint_path, write_checkpoint

SEQ_LEN = 16
ALPHABET = "abcdefghijklmnopqrstuvwxyz .,\n!?"  # 32 characters, one token each


class CharTokenizer:
    name = "chars"
    vocab_size = len(ALPHABET)
    eot_id = None  # the adapter falls back to the last token of "\n\n"

    def encode(self, text):
        return [ALPHABET.index(c) for c in text]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        return "".join(ALPHABET[i] for i in ids)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(vocab_size: int, seq_len: int = SEQ_LEN, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(model_config("tiny", vocab_size, seq_len=seq_len)).eval()
    with torch.no_grad():  # larger logits than the init's, so greedy choices are clear-cut
        model.lm_head.weight.mul_(20)
    return model


@pytest.fixture(scope="module")
def char_lm() -> SpectraLM:
    return SpectraLM(
        model=tiny_model(len(ALPHABET)), tokenizer=CharTokenizer(), device="cpu", batch_size=3
    )


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@torch.no_grad()
def window_log_probs(model: Llama, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[t+1] | tokens[:t+1]) for every t, from one forward of the model alone."""
    logits, _ = model(torch.tensor([tokens[:-1]]))
    log_probs = F.log_softmax(logits[0].double(), dim=-1)
    return log_probs.gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


@torch.no_grad()
def hand_loglikelihood(model: Llama, tok, context: str, continuation: str) -> tuple[float, bool]:
    ctx, cont = tok.encode(context), tok.encode(continuation)
    window = (ctx + cont)[-(model.cfg.seq_len + 1) :]  # left truncation of the context
    logits, _ = model(torch.tensor([window[:-1]]))
    picked = logits[0, -len(cont) :]
    logprob = F.log_softmax(picked.double(), -1).gather(1, torch.tensor(cont)[:, None]).sum()
    return float(logprob), picked.argmax(-1).tolist() == cont


def test_loglikelihood_matches_hand_log_probs_with_left_truncation(char_lm):
    pairs = [
        ("the cat sat", " on the mat"),
        ("a", "b"),
        ("hello there, how are you today? i am fine", " thanks"),  # > seq_len
        ("x" * 40, "yz"),  # > seq_len, ties broken by the sort
        ("short ", "word"),  # trailing space moves to the continuation
        ("", "no context"),  # the prefix token stands in
    ]
    got = char_lm.loglikelihood(requests("loglikelihood", pairs))
    tok, model = char_lm.tok, char_lm.model
    for (context, continuation), (logprob, greedy) in zip(pairs, got, strict=True):
        if context == "":
            context_text, cont = "\n", continuation  # the prefix token: last of "\n\n"
        else:
            stripped = context.rstrip()
            context_text, cont = stripped, context[len(stripped) :] + continuation
        want, want_greedy = hand_loglikelihood(model, tok, context_text, cont)
        assert logprob == pytest.approx(want, abs=1e-4)
        assert greedy == want_greedy
    assert len(pairs[2][0]) + len(pairs[2][1]) > SEQ_LEN + 1


def test_loglikelihood_greedy_flag_is_true_for_the_models_own_argmax(char_lm):
    context = "the cat"
    ids = char_lm.tok.encode(context)
    logits, _ = char_lm.model(torch.tensor([ids]))
    best = ALPHABET[int(logits[0, -1].argmax())]
    [(_, greedy)] = char_lm.loglikelihood(requests("loglikelihood", [(context, best)]))
    assert greedy


def test_loglikelihood_rolling_sums_disjoint_windows_of_max_length(char_lm):
    texts = ["to be or not to be, that is the question!\n" * 2, "short one", "abc" * 6]
    got = char_lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]))
    L = SEQ_LEN
    for text, total in zip(texts, got, strict=True):
        seq = [char_lm.eot_token_id, *char_lm.tok.encode(text)]
        want, p = 0.0, 1  # predict seq[p:q] from the window of L tokens before seq[q-1]
        while p < len(seq):
            q = min(p + L, len(seq))
            window = seq[max(0, q - 1 - L) : q]
            want += float(window_log_probs(char_lm.model, window)[-(q - p) :].sum())
            p = q
        assert total == pytest.approx(want, abs=1e-3)
    # Every token is scored once: the whole string's log-likelihood is below zero, finite.
    assert all(t < 0 for t in got)


def greedy_text(model: Llama, tok, context: str, n: int) -> str:
    idx = torch.tensor([tok.encode(context)])
    out = model.generate(idx, n, temperature=0)
    return tok.decode(out[0, idx.shape[1] :].tolist())


def test_generate_until_stops_at_max_gen_toks_and_at_stop_strings(char_lm):
    contexts = ["the cat sat on", "a", "hello there, friend"]
    model, tok = char_lm.model, char_lm.tok
    refs = [greedy_text(model, tok, c, 6) for c in contexts]
    got = char_lm.generate_until(
        requests("generate_until", [(c, {"until": [], "max_gen_toks": 6}) for c in contexts])
    )
    assert got == refs
    # Stop at the character the first greedy text has at position 3: text before it.
    stop = refs[0][3]
    cut = char_lm.generate_until(
        requests("generate_until", [(contexts[0], {"until": [stop], "max_gen_toks": 6})])
    )
    assert cut == [refs[0].split(stop)[0]]
    assert len(cut[0]) <= 3


def test_generate_until_keeps_the_last_context_tokens(char_lm):
    context = "abcdefghijklmnopqrstuvwxyz " * 2  # longer than seq_len
    [got] = char_lm.generate_until(
        requests("generate_until", [(context, {"until": [], "max_gen_toks": 4})])
    )
    kept = context[-(SEQ_LEN - 4) :]  # max_length - max_gen_toks, as lm-eval's HF adapter
    assert got == greedy_text(char_lm.model, char_lm.tok, kept, 4)


# --------------------------------------------------------------------- checkpoints on disk

PLAY = """MACBETH.
So foul and fair a day I have not seen, and yet the night is long and dark, and all the
while the witches speak of kings and crowns and things that should not be, till I am full
of thoughts that run like water through my hands and leave me
nothing but the shadow.

BANQUO.
How far is't call'd to Forres?

LADY MACBETH.
Come, you spirits that tend on mortal thoughts, unsex me here, and fill me from the crown
to the toe top-full of direst cruelty; make thick my blood, stop up the access and passage
to remorse, that no compunctious visitings of nature shake my fell purpose, nor keep peace
between the effect and it! Come to my woman's breasts, and take my milk for gall,
you murdering ministers!

[Exit.]
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory whose checkpoint holds a tiny byte-level model, and its dataset."""
    root = tmp_path_factory.mktemp("eval")
    data = begin_dataset(root / "data")
    docs = [("train", "some training text\n"), ("val", PLAY), ("val", PLAY.replace("foul", "fell"))]
    write_dataset(data, docs, ByteTokenizer(), meta={"name": "tiny-play"})
    model = tiny_model(256, seq_len=64)
    state = {
        "model_config": model.cfg.to_dict(),
        "model": model.state_dict(),
        "dataset_dir": str(data),
        "step": 1,
    }
    run = root / "run"
    write_checkpoint(checkpoint_path(run, 1), state)
    return run


def test_offline_task_builds_deterministically(run_dir, tmp_path):
    data = run_dir.parent / "data"
    first = build_offline_task(data, tmp_path / "a")
    second = build_offline_task(data, tmp_path / "b")
    assert first[1:] == second[1:] and first[1] == 4  # Banquo's line is too short
    a = (tmp_path / "a" / "shakespeare_lambada.jsonl").read_bytes()
    assert a == (tmp_path / "b" / "shakespeare_lambada.jsonl").read_bytes()
    passages = [json.loads(line) for line in a.decode().splitlines()]
    assert [p["target"] for p in passages] == ["shadow", "ministers"] * 2
    assert passages[0]["context"].startswith("MACBETH.\nSo foul and fair")
    assert passages[0]["context"].endswith("leave me\nnothing but the")
    # Its YAML reads the absolute data file, so lm-eval finds it from any directory.
    assert (
        str((tmp_path / "a" / "shakespeare_lambada.jsonl").resolve())
        in (tmp_path / "a" / "shakespeare_lambada.yaml").read_text()
    )


def test_build_passages_needs_a_speaker_and_a_plain_last_word():
    speech = " ".join(["word"] * 45)
    assert build_passages(f"KING.\n{speech} end.") == [
        {"context": f"KING.\n{speech}", "target": "end"}
    ]
    assert build_passages(f"not a speaker.\n{speech} end.") == []
    assert build_passages(f"KING.\n{speech} 42.") == []
    assert build_passages(f"KING.\n{' '.join(['w'] * 10)} end.") == []


MC_DOCS = [
    {"question": "The sun rises in the", "choices": ["east", "west", "sea"], "label": 0},
    {"question": "Two plus two is", "choices": ["five", "four"], "label": 1},
    {"question": "Water is", "choices": ["dry", "wet", "loud", "blue"], "label": 1},
    {"question": "Cats say", "choices": ["moo", "meow"], "label": 1},
    {"question": "A week has seven", "choices": ["days", "cats", "hours"], "label": 0},
]

MC_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def test_simple_evaluate_multiple_choice_accuracy_matches_hand_scores(run_dir, tmp_path):
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.format(data=data))
    results = lm_eval.simple_evaluate(
        model="spectra",
        model_args=f"ckpt={run_dir},device=cpu,batch_size=4",
        tasks=["tiny_mc"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=False,
        bootstrap_iters=0,
    )
    model = SpectraLM(ckpt=run_dir, device="cpu").model
    tok = ByteTokenizer()
    hits = []
    for doc in MC_DOCS:
        scores = [
            hand_loglikelihood(model, tok, doc["question"], " " + c)[0] for c in doc["choices"]
        ]
        hits.append(max(range(len(scores)), key=scores.__getitem__) == doc["label"])
    assert results["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))


def test_spectra_eval_writes_scores_and_compare_puts_runs_side_by_side(run_dir, capsys):
    assert main(["eval", str(run_dir), "--tasks", "shakespeare_lambada", "--batch-size", "2"]) == 0
    scores = (run_dir / "eval" / "scores.csv").read_text().splitlines()
    assert scores[0] == "task,metric,filter,n_shot,value,stderr"
    assert {line.split(",")[1] for line in scores[1:]} == {"acc", "perplexity"}
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert results["results"]["shakespeare_lambada"]["sample_len"] == 4
    capsys.readouterr()
    assert main(["compare", str(run_dir), str(run_dir), "--labels", "A", "B", "--downstream"]) == 0
    out = capsys.readouterr().out
    assert "| task | metric | shots | A | B |" in out
    assert "| shakespeare_lambada | acc | 0 |" in out
    for name in ("side.csv", "side.md"):
        table = run_dir / name
        argv = ["compare", str(run_dir), str(run_dir), "--labels", "A", "B", "--downstream"]
        assert main([*argv, "--table", str(table)]) == 0
        lines = table.read_text().splitlines()
        if name.endswith(".csv"):
            assert lines[0] == "task,metric,shots,A,B"
            acc = next(line.split(",") for line in lines if ",acc," in line)
            assert acc[3] == acc[4] and 0.0 <= float(acc[3]) <= 1.0  # the same run twice
        else:
            assert lines[0] == "| task | metric | shots | A | B |"


def test_spectra_eval_reports_a_missing_hub_task_in_one_line(run_dir, capsys, monkeypatch, recwarn):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["eval", str(run_dir), "--tasks", "arc_easy", "shakespeare_lambada"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("arc_easy:")]
    assert code == 0 and len(lines) == 1 and "HF_DATASETS_OFFLINE=1" in lines[0]
    # the tasks are built through lm-eval's current API, not its deprecated get_task_dict
    assert not [w for w in recwarn if "deprecated" in str(w.message).lower()]


def test_spectra_eval_refuses_an_unknown_task_and_an_hf_run_without_eot(run_dir, capsys):
    assert main(["eval", str(run_dir), "--tasks", "no_such_task"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown lm-eval task 'no_such_task'" in err
    # lm-eval's hf model needs an end-of-text token; the bytes tokenizer has none
    assert main(["eval", str(run_dir), "--tasks", "shakespeare_lambada", "--hf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs an end-of-text token" in err and "without --hf" in err
    assert not (run_dir / "eval" / "hf").exists()
