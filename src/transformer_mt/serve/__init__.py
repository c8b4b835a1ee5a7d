"""The HTTP service: ``transformer-mt-serve`` and its attention page.

:mod:`~transformer_mt.serve.model` holds the model, :mod:`~transformer_mt.serve.batcher` puts
concurrent requests into shared engine calls, :mod:`~transformer_mt.serve.app` is the FastAPI
application and :mod:`~transformer_mt.cli.serve` the command. Needs the ``serve`` extra
(FastAPI, uvicorn); imports neither Lightning nor the training wing.
"""
