"""Read GGUF metadata and estimate how much memory llama-server needs for a model (DESIGN §3).

``inspect(path)`` reads the header, the key/value metadata and the tensor table with
``gguf.GGUFReader`` (a memory map: tensor data is not read) and returns ``GgufFacts``.
``estimate_memory(facts, n_ctx)`` turns facts into a ``MemoryEstimate`` whose parts are exposed
so the panel can show where the bytes go. Reading a GGUF with a large vocabulary parses every
token string and takes up to a few seconds: call it from a thread when that matters.

Anything that is not a readable GGUF (missing, empty, text, truncated, malformed) raises
``GgufError`` with the path and the reason; nothing else escapes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

MAGIC = b"GGUF"
MIB = 1024 * 1024
DEFAULT_N_UBATCH = 512  # llama-server's default physical batch (common.h n_ubatch)
RUNTIME_OVERHEAD = 32 * MIB  # the process itself; see estimate_memory
_GUESSED = 1024  # LlamaFileType.GUESSED: a flag or-ed onto file_type by some converters


class GgufError(Exception):
    """The file is not a GGUF this module can read; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class GgufFacts:
    """What a GGUF says about its model. Counts are None when the metadata does not say."""

    path: Path
    file_size: int  # bytes on disk
    architecture: str  # general.architecture, e.g. "llama"
    name: str | None  # general.name
    parameter_count: int  # sum of the element counts of all tensors
    file_type: int | None  # general.file_type (llama_ftype), without the GUESSED flag
    quantisation: str  # file_type's name ("MOSTLY_Q4_K_M"), else "unknown"
    dominant_tensor_type: str  # the ggml type holding the most elements ("Q4_K", "F16")
    tensor_types: dict[str, int]  # ggml type name -> element count
    layers: int | None  # {arch}.block_count
    heads: int | None  # {arch}.attention.head_count (the largest, if per layer)
    kv_heads: int | None  # {arch}.attention.head_count_kv, defaulting to heads
    embedding_length: int | None  # {arch}.embedding_length (n_embd)
    feed_forward_length: int | None  # {arch}.feed_forward_length (n_ff)
    key_length: int | None  # per-head K width: {arch}.attention.key_length, or n_embd / heads
    value_length: int | None  # per-head V width: {arch}.attention.value_length, or n_embd / heads
    context_length: int | None  # {arch}.context_length: the trained context
    vocab_size: int | None  # length of tokenizer.ggml.tokens, or {arch}.vocab_size

    @property
    def n_embd_k_gqa(self) -> int | None:
        """K cache width per layer and token (key_length × kv_heads), as llama.cpp names it."""
        return _product(self.key_length, self.kv_heads)

    @property
    def n_embd_v_gqa(self) -> int | None:
        """V cache width per layer and token (value_length × kv_heads)."""
        return _product(self.value_length, self.kv_heads)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes a llama-server child needs for one model at one context size, part by part."""

    n_ctx: int  # the context size the estimate is for (the trained one if 0 was asked)
    weights: int
    kv_cache: int
    compute: int
    output: int
    runtime: int

    @property
    def overhead(self) -> int:
        """Everything that is neither weights nor KV cache."""
        return self.compute + self.output + self.runtime

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead


def inspect(path: str | os.PathLike[str]) -> GgufFacts:
    """Read the metadata and tensor table of the GGUF at ``path``; raise GgufError if unreadable."""
    path = Path(path)
    file_size = _check_file(path)
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as e:
        raise GgufError(f"{path}: malformed or truncated GGUF ({e})") from e
    except OSError as e:
        raise GgufError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        return _facts(path, file_size, reader)
    except (ValueError, IndexError, TypeError, OverflowError, UnicodeDecodeError) as e:
        raise GgufError(f"{path}: malformed GGUF metadata ({e})") from e


def estimate_memory(
    facts: GgufFacts,
    n_ctx: int,
    *,
    n_parallel: int = 1,
    kv_type_bytes: int = 2,
    n_ubatch: int = DEFAULT_N_UBATCH,
) -> MemoryEstimate:
    """Estimate the resident memory of llama-server serving ``facts`` with context ``n_ctx``.

    ``n_ctx`` is llama-server's ``--ctx-size``: the total KV cache shared by all ``n_parallel``
    slots (each slot gets n_ctx / n_parallel), so the KV cache does not grow with n_parallel;
    0 means the trained context, as in llama-server. The parts, in bytes:

    * weights  = the file size. llama-server maps the file and warm-up touches every tensor.
    * kv_cache = n_ctx × layers × (n_embd_k_gqa + n_embd_v_gqa) × kv_type_bytes, where
      n_embd_k_gqa = key_length × kv_heads (same for V); kv_type_bytes 2 is the default f16
      cache (q8_0 is about 1.06, q4_0 about 0.56: pass the rounded-up byte count).
    * compute  = n_ubatch × 4 × (3 × n_ff + 4 × n_embd): F32 activations of one micro-batch
      (gate, up and down of the feed-forward block plus a few residual-width tensors), with
      flash attention, which llama-server turns on by default where the backend has it.
      Without flash attention add n_ctx × n_ubatch × heads × 4 for the attention scores.
    * output   = n_vocab × 4 × n_parallel: one row of F32 logits per slot.
    * runtime  = RUNTIME_OVERHEAD (32 MiB): the process, its libraries, threads and HTTP server;
      a llama-server with a 3 MB model measures about 24 MiB resident on Linux x86-64.

    Sliding-window and recurrent models need less KV cache than this; mixture-of-experts
    models with n_ff per expert need more compute. Missing metadata counts as zero.
    """
    if n_ctx < 0 or n_parallel < 1 or kv_type_bytes < 1 or n_ubatch < 1:
        raise ValueError("n_ctx must be >= 0, n_parallel, kv_type_bytes and n_ubatch >= 1")
    ctx = n_ctx or facts.context_length or 0
    kv_width = (facts.n_embd_k_gqa or 0) + (facts.n_embd_v_gqa or 0)
    n_ff = facts.feed_forward_length or 0
    n_embd = facts.embedding_length or 0
    return MemoryEstimate(
        n_ctx=ctx,
        weights=facts.file_size,
        kv_cache=ctx * (facts.layers or 0) * kv_width * kv_type_bytes,
        compute=n_ubatch * 4 * (3 * n_ff + 4 * n_embd),
        output=(facts.vocab_size or 0) * 4 * n_parallel,
        runtime=RUNTIME_OVERHEAD,
    )


def _check_file(path: Path) -> int:
    try:
        with path.open("rb") as f:
            magic = f.read(4)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError as e:
        raise GgufError(f"{path}: no such file") from e
    except IsADirectoryError as e:
        raise GgufError(f"{path}: is a directory, not a GGUF file") from e
    except OSError as e:
        raise GgufError(f"{path}: cannot read: {e.strerror or e}") from e
    if size == 0:
        raise GgufError(f"{path}: empty file, not a GGUF")
    if magic != MAGIC:
        raise GgufError(f"{path}: not a GGUF file (starts with {magic!r}, expected {MAGIC!r})")
    return size


def _facts(path: Path, file_size: int, reader: gguf.GGUFReader) -> GgufFacts:
    arch = _str(reader, "general.architecture")
    if arch is None:
        raise GgufError(f"{path}: no general.architecture key")
    _check_tensor_extents(path, file_size, reader)
    types: Counter[str] = Counter()
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] += int(tensor.n_elements)
    n_embd = _int(reader, f"{arch}.embedding_length")
    heads = _int(reader, f"{arch}.attention.head_count")
    head_dim = n_embd // heads if n_embd and heads else None
    file_type = _int(reader, "general.file_type")
    if file_type is not None:
        file_type &= ~_GUESSED
    return GgufFacts(
        path=path,
        file_size=file_size,
        architecture=arch,
        name=_str(reader, "general.name"),
        parameter_count=sum(types.values()),
        file_type=file_type,
        quantisation=_file_type_name(file_type),
        dominant_tensor_type=types.most_common(1)[0][0] if types else "none",
        tensor_types=dict(types),
        layers=_int(reader, f"{arch}.block_count"),
        heads=heads,
        kv_heads=_int(reader, f"{arch}.attention.head_count_kv") or heads,
        embedding_length=n_embd,
        feed_forward_length=_int(reader, f"{arch}.feed_forward_length"),
        key_length=_int(reader, f"{arch}.attention.key_length") or head_dim,
        value_length=_int(reader, f"{arch}.attention.value_length") or head_dim,
        context_length=_int(reader, f"{arch}.context_length"),
        vocab_size=_vocab_size(reader, arch),
    )


def _check_tensor_extents(path: Path, file_size: int, reader: gguf.GGUFReader) -> None:
    # The reader maps the file and slices past its end without complaint: check it here.
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > file_size:
            raise GgufError(
                f"{path}: truncated: tensor {tensor.name} ends at byte {end} "
                f"but the file has {file_size} bytes"
            )


def _file_type_name(file_type: int | None) -> str:
    if file_type is None:
        return "unknown"
    try:
        return gguf.LlamaFileType(file_type).name
    except ValueError:
        return f"unknown ({file_type})"


def _vocab_size(reader: gguf.GGUFReader, arch: str) -> int | None:
    tokens = reader.get_field("tokenizer.ggml.tokens")
    if tokens is not None:
        return len(tokens.data)
    return _int(reader, f"{arch}.vocab_size")


def _str(reader: gguf.GGUFReader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None or field.types != [gguf.GGUFValueType.STRING]:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _int(reader: gguf.GGUFReader, key: str) -> int | None:
    """Read an integer key; a per-layer array (some architectures) gives its largest value."""
    field = reader.get_field(key)
    if field is None or not field.types:
        return None
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        if field.types[1:] and field.types[1] not in _INT_TYPES:
            return None
        values: Sequence[int] = [int(field.parts[i][0]) for i in field.data]
        return max(values, default=None)
    if field.types[0] in _INT_TYPES:
        return int(np.asarray(field.parts[field.data[0]])[0])
    return None


def _product(a: int | None, b: int | None) -> int | None:
    return a * b if a is not None and b is not None else None


_INT_TYPES = frozenset(
    {
        gguf.GGUFValueType.UINT8,
        gguf.GGUFValueType.INT8,
        gguf.GGUFValueType.UINT16,
        gguf.GGUFValueType.INT16,
        gguf.GGUFValueType.UINT32,
        gguf.GGUFValueType.INT32,
        gguf.GGUFValueType.UINT64,
        gguf.GGUFValueType.INT64,
    }
)
