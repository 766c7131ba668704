"""Prompts as ``input_ids`` of exact length, and one blocking ``/generate`` on a sandbox."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request

from schedtrace.tracer.sandbox.server import SandboxServer

VOCAB_SIZE = 512  # every sandbox model's tiny vocabulary (make_tiny_model.py): every id below it is a real token
FIRST_WORD = 3  # ids below this are the special tokens
GENERATE_TIMEOUT_S = 600.0


def random_input_ids(length: int, seed: object) -> list[int]:
    """``length`` token ids in [FIRST_WORD, VOCAB_SIZE) (no special tokens), fixed by ``seed``."""
    rng = random.Random(str(seed))
    return [rng.randrange(FIRST_WORD, VOCAB_SIZE) for _ in range(length)]


def generate(
    server: SandboxServer,
    rid: str,
    input_len: int,
    max_new_tokens: int,
    *,
    ignore_eos: bool = True,
    sampling_params: dict | None = None,
    prefix_ids: list[int] | None = None,
    timeout_s: float = GENERATE_TIMEOUT_S,
) -> dict:
    """POST ``/generate`` and return sglang's JSON reply (blocks until finished).

    The prompt is ``input_len`` random token ids (seeded by ``rid``, so the
    same rid gives the same prompt), sent as ``input_ids``; ``rid`` becomes
    sglang's request id (it shows up in traces and in ``meta_info["id"]``).
    ``ignore_eos`` defaults to True so exactly ``max_new_tokens`` are produced.
    ``sampling_params`` are merged over ``max_new_tokens``/``ignore_eos``.
    ``prefix_ids`` (e.g. a shared system prompt) replace the first ids of the
    prompt, which keeps ``input_len`` tokens.
    The reply has ``text``, ``output_ids`` and ``meta_info`` (``id``,
    ``prompt_tokens``, ``completion_tokens``, ``finish_reason``,
    ``num_retractions``, ...). Raises ``AssertionError`` with the server's
    body on a non-200 answer.
    """
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
    params.update(sampling_params or {})
    input_ids = random_input_ids(input_len, rid)
    if prefix_ids:
        input_ids[: len(prefix_ids)] = prefix_ids
    body = {"rid": rid, "input_ids": input_ids, "sampling_params": params}
    request = urllib.request.Request(
        server.url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(
            f"/generate rid={rid!r} answered {exc.code}: {exc.read()[:2000]!r}"
        ) from None
