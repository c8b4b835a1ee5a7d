"""Evaluate a checkpoint: `python evaluate.py ckpt_path=PATH [key=value ...]`.

The command `transformer-mt-evaluate` of an installed package, run from the checkout: Hydra
composes configs/evaluate.yaml and transformer_mt.inference.evaluate.run does the work
(transformer_mt.commands). User mistakes are one `error: ...` line and exit status 2
(TRANSFORMER_MT_DEBUG=1 or HYDRA_FULL_ERROR=1 shows the traceback; docs/errors.md).
"""

from transformer_mt.commands import evaluate

if __name__ == "__main__":
    evaluate()
