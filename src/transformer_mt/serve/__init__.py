"""The HTTP service: ``transformer-mt-serve`` and its attention page.

By layer: :mod:`~.middleware` (body limit, API key), :mod:`~.schemas` (the request bodies),
:mod:`~.service` (requests into searches, checks, the batcher's jobs) and :mod:`~.app` (the
routes); :mod:`~.model` holds the model and :mod:`~.batcher` shares its engine calls. Needs the
``serve`` extra (FastAPI, uvicorn); imports neither Lightning nor the training wing.
"""
