"""The request bodies (pydantic: strict, no unknown field) and what a malformed one is told.

No field names a path, so a client cannot make the server read or write a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _encodable(text: str) -> str:
    """``text`` unchanged, unless it holds a lone UTF-16 surrogate (``"\\ud800"`` is valid
    JSON but no character): the tokenizer cannot take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"holds a lone UTF-16 surrogate ({text[err.start]!a}) at character {err.start}, "
            "which is no character; send the text as UTF-8 (a surrogate pair spells one "
            "character)"
        ) from None
    return text


#: Text the service tokenizes: any string that is made of characters.
Text = Annotated[str, AfterValidator(_encodable)]


class DecodingFields(BaseModel):
    """Decoding options a request may set; absent = the checkpoint's stored default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # The ranges are stated for clients (json_schema_extra) and checked by the service, whose
    # message names the fix; the upper bounds are the service's own limits.
    beam_size: int | None = Field(
        None, description="beam size (1 = greedy)", json_schema_extra={"minimum": 1}
    )
    length_penalty: float | None = Field(
        None,
        description="alpha of the checkpoint's length normalisation, gnmt or power (>= 0)",
        json_schema_extra={"minimum": 0, "maximum": 10},
    )
    sampling_topk: int | None = Field(
        None,
        description="sample each token from the K most likely (0 = the whole vocabulary) "
        "instead of searching; beam_size must be 1",
        json_schema_extra={"minimum": 0},
    )
    sampling_topp: float | None = Field(
        None,
        description="sample from the most likely tokens whose probability reaches P, (0, 1]",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": 1},
    )
    temperature: float | None = Field(
        None,
        description="sampling temperature (> 0; > 1 flattens the distribution)",
        json_schema_extra={"exclusiveMinimum": 0},
    )
    seed: int | None = Field(
        None, description="sampling seed: the same seed and sentence give the same samples"
    )
    tgt_lang: Text | None = Field(
        None,
        description="the language to translate into, for a multilingual model (default: the "
        "service's --tgt-lang); GET /model lists target_languages",
    )


#: The request fields that set sampling, passed to the search as they are.
SAMPLING_FIELDS = ("sampling_topk", "sampling_topp", "temperature", "seed")


class TranslateRequest(DecodingFields):
    text: list[Text] = Field(
        description="the sentences to translate, one per item", json_schema_extra={"minItems": 1}
    )
    nbest: int | None = Field(
        None,
        description="also return the n best hypotheses of each sentence (<= beam_size; with "
        "sampling, the samples drawn per sentence)",
        json_schema_extra={"minimum": 1},
    )
    prefix: list[Text] | None = Field(
        None,
        description='one target prefix per text item ("" for none): each output starts with it',
    )
    constraints: list[list[Text]] | None = Field(
        None,
        description="target phrases per text item ([] for none) that each output contains "
        "(beam search, torch engine)",
    )
    alignments: bool = Field(
        False, description="add each output's word alignment to its source (Pharaoh i-j pairs)"
    )


class AttentionRequest(DecodingFields):
    text: Text = Field(description="one source sentence")
    translation: Text | None = Field(
        None, description="the output to attend over (default: the model's translation)"
    )


class ErrorBody(BaseModel):
    """Every answer but a 200: one line, the cause and the fix."""

    error: str = Field(description="what was wrong and what to do, on one line")


#: Each status the service answers besides 200, as its OpenAPI schema lists it.
ERRORS = {
    400: "the body is not JSON (LibreTranslate's routes: any bad parameter or language pair)",
    401: "the service has an API key and the request has none, or another",
    403: "LibreTranslate's routes: the service has an API key and api_key is missing or another",
    413: "too large: the body's bytes, the sentences, the characters or the attention weights",
    422: "a field is unknown, of the wrong type or out of range",
    500: "the engine failed on this request; the message holds an incident id for the log",
    503: "the queue is full; retry later",
    504: "no answer within the service's time-out; send less",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that can answer ``statuses``."""
    return {s: {"model": ErrorBody, "description": ERRORS[s]} for s in statuses}


def validation_message(exc: RequestValidationError, known: Iterable[str]) -> tuple[int, str]:
    """The first problem of a request body as one line, and its status (``known``: the
    route's options)."""
    problems = exc.errors()
    first = problems[0] if problems else {}
    kind, where = first.get("type", ""), [str(p) for p in first.get("loc", ()) if p != "body"]
    if kind == "json_invalid":
        return (
            400,
            'the request body is not valid JSON; send a JSON object such as {"text": ["..."]}',
        )
    if kind == "extra_forbidden":
        return 422, f"unknown option {'.'.join(where)!r}; the options are {', '.join(known)}"
    if kind == "missing" and where:
        return 422, f'{".".join(where)} is missing; send a JSON object such as {{"text": ["..."]}}'
    place = ".".join(where) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return 422, f"{place}: {message}; see /docs for the request schema"


def spell(setting: str, value: Any) -> str:
    """A fix as this service's user writes it: a request field as JSON, anything else as the
    flag of ``transformer-mt-serve`` (``--engine torch``)."""
    if setting in TranslateRequest.model_fields:
        return f'"{setting}": {json.dumps(value)}'
    return f"transformer-mt-serve --{setting.replace('_', '-')} {value}"
