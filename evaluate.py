"""Evaluate a checkpoint: `python evaluate.py ckpt_path=PATH [key=value ...]`.

The command `transformer-mt-evaluate` of an installed package (transformer_mt.cli.entry), run
from the checkout. User mistakes are one `error: ...` line and exit status 2
(TRANSFORMER_MT_DEBUG=1 or HYDRA_FULL_ERROR=1 shows the traceback; docs/errors.md).
"""

from transformer_mt.cli.entry import evaluate as main

if __name__ == "__main__":
    main()
