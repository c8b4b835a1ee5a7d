"""Translate text with a checkpoint (same as the `transformer-mt-translate` command).

python scripts/translate.py --ckpt run/checkpoints/last.ckpt < input.en > output.de
"""

import sys

from transformer_mt.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
