"""lm-eval's command line with ``--model spectra`` registered:
``python -m spectra_lab.eval --model spectra --model_args ckpt=RUN_DIR --tasks ...``."""

from lm_eval.__main__ import cli_evaluate

import spectra_lab.eval.adapter  # noqa: F401  (registers the model)

if __name__ == "__main__":
    cli_evaluate()
