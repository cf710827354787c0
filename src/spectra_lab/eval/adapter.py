"""lm-evaluation-harness adapter for the harness's checkpoints: ``--model spectra``.

Importing this module registers :class:`SpectraLM` under the name ``"spectra"`` in
``lm_eval``'s model registry, after which

    lm_eval.simple_evaluate(model="spectra", model_args="ckpt=RUN_DIR", tasks=[...])

works, and so does lm-eval's own command line run as ``python -m spectra_lab.eval
--model spectra --model_args ckpt=RUN_DIR,batch_size=16 --tasks ...``.

Scoring follows lm-eval's Hugging Face adapter (``lm_eval.models.huggingface.HFLM``):
requests are sorted longest first and batched with :class:`lm_eval.models.utils.Collator`;
``context + continuation`` longer than the model's context length loses tokens on the LEFT
of the context; an empty context is replaced by the end-of-text token; rolling
log-likelihoods use lm-eval's disjoint windows. Our model has no attention mask, so every
batch is padded on the right, where padding is never attended by the real positions.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import lm_eval.models  # noqa: F401  (fills the registry before we add to it)
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from spectra_lab.data.tokenizers import EOT_TEXT, Tokenizer

__all__ = ["SpectraLM"]

DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256


def _parse_batch_size(value: Any) -> int:
    if value is None or str(value).startswith("auto"):  # no probing: a fixed default
        return DEFAULT_BATCH_SIZE
    n = int(value)
    if n < 1:
        raise ValueError(f"batch_size must be a positive integer, got {value!r}")
    return n


@register_model("spectra")
class SpectraLM(TemplateLM):
    """A ``spectra train`` checkpoint (file, DCP directory or run directory) as an lm-eval LM.

    ``model_args``: ``ckpt`` (required), ``device`` (default ``cuda`` when available),
    ``batch_size`` (default 16), ``max_length`` (at most the model's ``seq_len``, the
    default), ``max_gen_toks`` (default 256) and ``dataset_dir`` (where the tokenizer is;
    default the prepared dataset the checkpoint was trained on). On CUDA the forward runs
    under bf16 autocast; log-softmax is always taken in float32.
    """

    def __init__(
        self,
        ckpt: str | Path | None = None,
        device: str | None = None,
        batch_size: int | str | None = None,
        max_length: int | str | None = None,
        max_gen_toks: int | str = DEFAULT_MAX_GEN_TOKS,
        dataset_dir: str | Path | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Tokenizer | None = None,
        **_ignored: Any,  # lm-eval passes max_batch_size and others we do not use
    ) -> None:
        super().__init__()
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            # lm-eval's command line passes cuda by default, also on machines without one
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        self.dataset_dir = Path(dataset_dir) if dataset_dir is not None else None
        if model is None:
            if ckpt is None:
                raise ValueError("model_args needs ckpt=RUN_DIR (a run directory or checkpoint)")
            from spectra_lab.runs.model import load_model

            model, state = load_model(ckpt, device=str(self._device))
            self.dataset_dir = self.dataset_dir or Path(state["dataset_dir"])
            if tokenizer is None:
                from spectra_lab.data import load_tokenizer

                tokenizer = load_tokenizer(self.dataset_dir)
        elif tokenizer is None:
            raise ValueError("a model passed directly needs its tokenizer")
        self.model = model.to(self._device).eval()
        self.tok = tokenizer
        seq_len = int(model.cfg.seq_len)
        self._max_length = seq_len if max_length is None else int(max_length)
        if not 1 <= self._max_length <= seq_len:
            raise ValueError(f"max_length must be in [1, {seq_len}], got {max_length!r}")
        self.batch_size = _parse_batch_size(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        # A tokenizer without end-of-text separates documents by a blank line.
        eot = tokenizer.eot_id
        self._eot_id = eot if eot is not None else tokenizer.encode("\n\n")[-1]
        self._eot_text = EOT_TEXT if eot is not None else None

    # ------------------------------------------------------------------ properties

    @property
    def eot_token_id(self) -> int:
        return self._eot_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kw) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens)

    # ------------------------------------------------------------------ forward

    def _autocast(self):
        if self._device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @torch.no_grad()
    def _log_probs(self, rows: list[list[int]]) -> torch.Tensor:
        """Float32 log-softmax ``[B, T, vocab]`` of the rows, right-padded to one length."""
        width = max(len(r) for r in rows)
        batch = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            batch[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with self._autocast():
            logits, _ = self.model(batch.to(self._device))
        return F.log_softmax(logits.float(), dim=-1)

    # ------------------------------------------------------------------ scoring

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation | context), continuation is the greedy one)``."""

        def longest_first(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        collator = Collator(requests, sort_fn=longest_first)
        results = []
        for chunk in collator.get_batched(n=self.batch_size):
            rows, spans = [], []
            for _, context, continuation in chunk:
                if not continuation:
                    raise ValueError("a loglikelihood request has an empty continuation")
                if len(continuation) > self.max_length:
                    raise ValueError(
                        f"continuation of {len(continuation)} tokens exceeds max_length "
                        f"{self.max_length}"
                    )
                # The last max_length + 1 tokens; the final one is only a target.
                row = (context + continuation)[-(self.max_length + 1) :][:-1]
                rows.append(row)
                spans.append((len(row) - len(continuation), continuation))
            log_probs = self._log_probs(rows)
            for lp, (start, continuation), req in zip(log_probs, spans, chunk, strict=True):
                lp = lp[start : start + len(continuation)]
                target = torch.tensor(continuation, device=lp.device)
                logprob = lp.gather(1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all())
                results.append((logprob, greedy))
                if req[0] is not None:
                    self.cache_hook.add_partial("loglikelihood", req[0], (logprob, greedy))
        return collator.get_original(results)

    def loglikelihood_rolling(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[float]:
        """Log-likelihood of each whole string, in disjoint windows of ``max_length``."""
        windows, owners = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for window in get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            ):
                windows.append((None, *make_disjoint_window(window)))
                owners.append(i)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows), strict=True):
            totals[owner] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, with ``do_sample``, sampled) continuations, cut at the first stop string.

        The context keeps its last ``max_length - max_gen_toks`` tokens (at least one); the
        window fed to the model slides when context and generation outgrow ``max_length``.
        """
        encoded = [(self.tok_encode(ctx), kw) for ctx, kw in (r.args for r in requests)]
        collator = Collator(
            list(range(len(encoded))),
            sort_fn=lambda i: -len(encoded[i][0]),
            group_by="gen_kwargs",
            group_fn=lambda i: encoded[i][1],
        )
        results = []
        for chunk in collator.get_batched(n=self.batch_size):
            kwargs = normalize_gen_kwargs(dict(encoded[chunk[0]][1]), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=self._eot_text)
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            if not kwargs.pop("do_sample", False):
                temperature = 0.0
            keep = max(self.max_length - max_gen_toks, 1)
            contexts = [encoded[i][0][-keep:] or [self.prefix_token_id] for i in chunk]
            for text in self._generate(contexts, until, max_gen_toks, temperature):
                results.append(text)
        for req, text in zip(requests, collator.get_original(results), strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return collator.get_original(results)

    @torch.no_grad()
    def _generate(
        self, contexts: list[list[int]], until: list[str], max_gen_toks: int, temperature: float
    ) -> list[str]:
        generated: list[list[int]] = [[] for _ in contexts]
        active = list(range(len(contexts)))
        for _ in range(max_gen_toks):
            if not active:
                break
            rows = [(contexts[i] + generated[i])[-self.max_length :] for i in active]
            log_probs = self._log_probs(rows)
            last = log_probs[torch.arange(len(rows)), [len(r) - 1 for r in rows]]
            if temperature > 0:
                next_ids = torch.multinomial(torch.softmax(last / temperature, -1), 1)[:, 0]
            else:
                next_ids = last.argmax(-1)
            still = []
            for i, tok in zip(active, next_ids.tolist(), strict=True):
                generated[i].append(tok)
                if not any(stop in self.tok_decode(generated[i]) for stop in until):
                    still.append(i)
            active = still
        texts = []
        for toks in generated:
            text = self.tok_decode(toks)
            for stop in until:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
        return texts
