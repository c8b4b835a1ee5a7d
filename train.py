"""Train a Transformer: `python train.py [experiment=multi30k_de_en] [key=value ...]`.

The command `transformer-mt-train` of an installed package (transformer_mt.cli.entry), run
from the checkout.
"""

from transformer_mt.cli.entry import train as main

if __name__ == "__main__":
    main()
