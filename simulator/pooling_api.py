"""The pooling routes of an engine running a pooling model, as vLLM 0.32 answers them: for
an embedding model /v1/embeddings, /pooling, /score (/v1/score), /rerank (/v1/rerank,
/v2/rerank); for a classifier /classify and /pooling.

Pure functions: a request body in, a JSON-ready answer (or an `ApiError`) out. Embeddings are
made up but deterministic: each token id stands for a fixed random vector, a text for the
normalised sum of its tokens' vectors, so texts sharing words score closer. Scores are the
cosine similarity of two texts' embeddings, as vLLM scores with an embedding model; a
classifier's probabilities are the softmax of such a vector, one entry per label. Shapes follow
tests/golden/vllm-0.32/ (embeddings.json, pooling.json, score.json, rerank.json, classify.json).
`size` is the length of the pooled vector: the embedding's dimensions, or the labels.
"""

from __future__ import annotations

import base64
import math
import random
import struct
import time
import uuid
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from simulator.openai_api import ApiError

Encode = Callable[[str], list[int]]


@lru_cache(maxsize=4096)
def _token_vector(token: int, dims: int) -> tuple[float, ...]:
    rng = random.Random(token)
    return tuple(rng.uniform(-1.0, 1.0) for _ in range(dims))


def embed(ids: list[int], dims: int) -> list[float]:
    """A unit vector for a text's token ids."""
    total = [0.0] * dims
    for t in ids:
        for i, x in enumerate(_token_vector(t, dims)):
            total[i] += x
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return [x / norm for x in total]


def _texts(value: Any, param: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    raise ApiError(f"{param} must be a string or a non-empty list of strings", param=param)


def _usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _envelope(kind: str, model: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    return {
        "id": f"{kind}-{uuid.uuid4().hex[:16]}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": _usage(tokens),
    }


def embeddings(body: dict[str, Any], model: str, encode: Encode, size: int) -> dict[str, Any]:
    texts = _texts(body.get("input"), "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ApiError("encoding_format must be 'float' or 'base64'", param="encoding_format")
    data = []
    tokens = 0
    for i, text in enumerate(texts):
        ids = encode(text)
        tokens += len(ids)
        vector = embed(ids, size)
        value: list[float] | str = vector
        if fmt == "base64":
            value = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode("ascii")
        data.append({"index": i, "object": "embedding", "embedding": value})
    return _envelope("embd", model, data, tokens)


def pooling(body: dict[str, Any], model: str, encode: Encode, size: int) -> dict[str, Any]:
    texts = _texts(body.get("input"), "input")
    data = []
    tokens = 0
    for i, text in enumerate(texts):
        ids = encode(text)
        tokens += len(ids)
        data.append({"index": i, "object": "pooling", "data": embed(ids, size)})
    return _envelope("pooling", model, data, tokens)


def _similarities(
    query: str, documents: list[str], encode: Encode, size: int
) -> tuple[list[float], int]:
    q_ids = encode(query)
    q = embed(q_ids, size)
    scores = []
    tokens = 0
    for doc in documents:
        ids = encode(doc)
        tokens += len(q_ids) + len(ids)
        d = embed(ids, size)
        scores.append(sum(a * b for a, b in zip(q, d, strict=True)))
    return scores, tokens


def score(body: dict[str, Any], model: str, encode: Encode, size: int) -> dict[str, Any]:
    first = _texts(body.get("text_1", body.get("data_1")), "text_1")
    second = _texts(body.get("text_2", body.get("data_2")), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ApiError("text_1 and text_2 must have the same length, or text_1 one text")
    data = []
    tokens = 0
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        (value,), used = _similarities(a, [b], encode, size)
        tokens += used
        data.append({"index": i, "object": "score", "score": value})
    return _envelope("score", model, data, tokens)


def rerank(body: dict[str, Any], model: str, encode: Encode, size: int) -> dict[str, Any]:
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError("query must be a string", param="query")
    documents = _texts(body.get("documents"), "documents")
    scores, tokens = _similarities(query, documents, encode, size)
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    top_n = body.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        order = order[:top_n]
    return {
        "id": f"score-{uuid.uuid4().hex[:16]}",  # vLLM reranks by scoring
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [
            {
                "index": i,
                "document": {"text": documents[i], "multi_modal": None},
                "relevance_score": scores[i],
            }
            for i in order
        ],
    }


def _probabilities(ids: list[int], labels: int) -> list[float]:
    logits = [4.0 * x for x in embed(ids, labels)]
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def classify(body: dict[str, Any], model: str, encode: Encode, size: int) -> dict[str, Any]:
    texts = _texts(body.get("input"), "input")
    data = []
    tokens = 0
    for i, text in enumerate(texts):
        ids = encode(text)
        tokens += len(ids)
        probs = _probabilities(ids, size)
        best = max(range(size), key=probs.__getitem__)
        data.append({"index": i, "label": f"LABEL_{best}", "probs": probs, "num_classes": size})
    return _envelope("classify", model, data, tokens)


def classifier_pooling(
    body: dict[str, Any], model: str, encode: Encode, size: int
) -> dict[str, Any]:
    """/pooling on a classifier: each input's label probabilities."""
    texts = _texts(body.get("input"), "input")
    data = []
    tokens = 0
    for i, text in enumerate(texts):
        ids = encode(text)
        tokens += len(ids)
        data.append({"index": i, "object": "pooling", "data": _probabilities(ids, size)})
    return _envelope("pooling", model, data, tokens)


Answer = Callable[[dict[str, Any], str, Encode, int], dict[str, Any]]

# The routes vLLM registers for each pooling task (`--convert embed` or `classify`), and the
# function answering each.
ROUTES_BY_TASK: dict[str, dict[str, Answer]] = {
    "embed": {
        "/v1/embeddings": embeddings,
        "/pooling": pooling,
        "/score": score,
        "/v1/score": score,
        "/rerank": rerank,
        "/v1/rerank": rerank,
        "/v2/rerank": rerank,
    },
    "classify": {"/classify": classify, "/pooling": classifier_pooling},
}
