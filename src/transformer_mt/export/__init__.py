"""Export: a checkpoint as a Hugging Face model directory, and that directory as CTranslate2.

Above inference (it checks the exported logits against ours); the command line is
:mod:`transformer_mt.cli.export`.
"""
