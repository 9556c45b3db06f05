"""Tokenize one UTF-8 byte per token, generate the simulated words and embed text as a hash.

Deterministic on purpose: /tokenize and /detokenize round-trip exactly, and the same text
always gets the same vector.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

from routerpanel.router.simserver.common import JSON, ApiError

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_PIECES = {UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
N_SPECIAL = len(SPECIAL_PIECES)
N_VOCAB = N_SPECIAL + 256


def tokenize(text: str, add_special: bool = False) -> list[int]:
    """Tokenize as one token per UTF-8 byte (ids 3..258), after BOS if ``add_special``."""
    ids = [N_SPECIAL + byte for byte in text.encode("utf-8", "replace")]
    return [BOS_ID, *ids] if add_special else ids


def token_bytes(token: int) -> bytes:
    """Return the bytes of one token; special tokens render as their text, like llama.cpp."""
    if N_SPECIAL <= token < N_VOCAB:
        return bytes([token - N_SPECIAL])
    if token in SPECIAL_PIECES:
        return SPECIAL_PIECES[token].encode()
    raise ApiError(400, f"token id {token} is out of range [0, {N_VOCAB})")


def detokenize(tokens: Sequence[int]) -> str:
    """Invert tokenize(); bytes that are not valid UTF-8 become U+FFFD."""
    return b"".join(token_bytes(t) for t in tokens).decode("utf-8", "replace")


def tokenize_mixed(content: Any, add_special: bool) -> list[int]:
    """Tokenize a string, or a list mixing strings and token ids (llama.cpp's tokenize_mixed)."""
    if isinstance(content, str):
        return tokenize(content, add_special)
    if not isinstance(content, list):
        raise ApiError(400, '"content" must be a string or an array of strings and token ids')
    tokens = [BOS_ID] if add_special else []
    for item in content:
        if isinstance(item, str):
            tokens.extend(tokenize(item))
        elif isinstance(item, int) and not isinstance(item, bool):
            tokens.append(item)
        else:
            raise ApiError(400, '"content" must be a string or an array of strings and token ids')
    return tokens


def token_ids(value: Any) -> list[int]:
    """Return ``value`` as a list of token ids, or refuse it with a 400."""
    if isinstance(value, list) and all(type(t) is int for t in value):
        return list(value)
    raise ApiError(400, "[json.exception.type_error.302] type must be an array of numbers")


def sim_piece(model_id: str, index: int) -> str:
    """Return generated token ``index``: the words of "simulated response from <id>", cycling."""
    words = f"simulated response from {model_id}".split()
    word = words[index % len(words)]
    return word if index == 0 else " " + word


def embed(text: str) -> list[float]:
    """Return a deterministic L2-normalised vector for ``text``: a hash, not a meaning."""
    raw = [byte - 127.5 for byte in hashlib.sha512(text.encode("utf-8", "replace")).digest()]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [round(v / norm, 6) for v in raw]


def piece_json(token: int) -> Any:
    """Return a token's piece as text, or as its byte values when it is not valid UTF-8."""
    data = token_bytes(token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def embedding_inputs(value: Any) -> list[str]:
    """Return the texts to embed: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return [detokenize(value)]
    if isinstance(value, list) and value:
        return [item if isinstance(item, str) else detokenize(token_ids(item)) for item in value]
    raise ApiError(400, '"input" must not be empty')


def embedding_object(index: int, vector: list[float], as_base64: bool) -> JSON:
    if not as_base64:
        return {"embedding": vector, "index": index, "object": "embedding"}
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return {"embedding": packed, "index": index, "object": "embedding", "encoding_format": "base64"}
