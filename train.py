"""Train a Transformer: `python train.py [experiment=multi30k_de_en] [key=value ...]`.

The command `transformer-mt-train` of an installed package, run from the checkout: Hydra composes
configs/train.yaml and transformer_mt.training.run.run does the work (transformer_mt.commands).
"""

from transformer_mt.commands import train

if __name__ == "__main__":
    train()
