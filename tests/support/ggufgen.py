"""Write tiny llama-architecture GGUF models with random weights, for tests.

The weights are random (seeded, so the same arguments give the same bytes) and the model talks
gibberish, but llama-server loads it and generates tokens: the tensor names and shapes are those
of llama.cpp's ``LLM_ARCH_LLAMA`` and the tokenizer keys (``tokenizer.ggml.*``) are copied from
llama.cpp's ``models/ggml-vocab-llama-spm.gguf`` (32000 tokens; ``tools/build_llama.sh`` puts it
in the cache). Without a vocab file a tiny fake SPM tokenizer is written instead: enough for tests
that only inspect metadata, not meant for llama-server.

The file size is dominated by ``token_embd`` and ``output`` (n_vocab × n_embd each); ``SIZES``
picks n_embd, layers and dtype to land near 3 MB, 50 MB and 200 MB.

Shapes below are numpy order (rows, cols); GGUF/ggml stores them reversed, so ``token_embd``
(n_vocab, n_embd) is ggml's ``{n_embd, n_vocab}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

Dtype = Literal["f32", "f16"]

TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
)
FAKE_VOCAB_SIZE = 320  # <unk> <s> </s>, 256 byte tokens, a few word pieces
_FILE_TYPE = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
_NP_DTYPE = {"f32": np.float32, "f16": np.float16}


@dataclass(frozen=True)
class TinySpec:
    """The dimensions of one tiny model; ``write`` hands them to ``write_tiny_llama``."""

    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    dtype: Dtype
    seed: int
    n_head_kv: int | None = None
    ctx: int = 512

    def write(self, path: Path, vocab_path: Path | None) -> Path:
        return write_tiny_llama(
            path,
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            n_ff=self.n_ff,
            ctx=self.ctx,
            vocab_path=vocab_path,
            seed=self.seed,
            dtype=self.dtype,
        )


# Sizes with the 32000-token SPM vocab (the tokenizer arrays add ~0.7 MB to each file):
#   tiny    2 × 32000 × 16 × 2 B   = 2.0 MB of embedding/output            →   2.8 MB file
#   small   2 × 32000 × 192 × 4 B  = 49 MB, plus 2 layers of 1.8 MB         →  53 MB file
#   medium  2 × 32000 × 768 × 2 B  = 98 MB, plus 6 GQA layers of 16 MB     → 196 MB file
SIZES: dict[str, TinySpec] = {
    "tiny": TinySpec(n_embd=16, n_layer=1, n_head=2, n_ff=48, dtype="f16", seed=1),
    "small": TinySpec(n_embd=192, n_layer=2, n_head=4, n_ff=512, dtype="f32", seed=2),
    "medium": TinySpec(
        n_embd=768, n_layer=6, n_head=12, n_head_kv=4, n_ff=2816, dtype="f16", seed=3
    ),
}


def write_tiny_llama(
    path: Path,
    *,
    n_embd: int,
    n_layer: int,
    n_head: int,
    n_ff: int,
    ctx: int = 512,
    vocab_path: Path | None,
    seed: int,
    dtype: Dtype = "f16",
    n_head_kv: int | None = None,
    name: str | None = None,
) -> Path:
    """Write a llama GGUF with random weights to ``path`` and return ``path``.

    ``vocab_path`` is a GGUF whose ``tokenizer.ggml.*`` keys are copied (its token count becomes
    n_vocab); ``None`` writes a fake tokenizer of ``FAKE_VOCAB_SIZE`` tokens. 2-D weights use
    ``dtype``; norms stay F32 like llama.cpp's converter writes them. ``n_head_kv`` below
    ``n_head`` makes a grouped-query-attention model.
    """
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    tokenizer = _read_tokenizer(vocab_path) if vocab_path is not None else _fake_tokenizer()
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"][0])
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name or f"tiny-llama-{n_embd}x{n_layer}-{dtype}")
    writer.add_context_length(ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(_FILE_TYPE[dtype])
    for key, (value, vtype, sub_type) in tokenizer.items():
        writer.add_key_value(key, value, vtype, sub_type)
    rng = np.random.default_rng(seed)
    shapes = _tensor_shapes(n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff)
    for tensor_name, shape in shapes:
        writer.add_tensor(tensor_name, _weights(rng, shape, dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensor_shapes(
    n_vocab: int, n_embd: int, n_layer: int, n_head: int, n_head_kv: int, n_ff: int
) -> Iterator[tuple[str, tuple[int, ...]]]:
    n_embd_gqa = n_embd // n_head * n_head_kv
    yield "token_embd.weight", (n_vocab, n_embd)
    for i in range(n_layer):
        yield f"blk.{i}.attn_norm.weight", (n_embd,)
        yield f"blk.{i}.attn_q.weight", (n_embd, n_embd)
        yield f"blk.{i}.attn_k.weight", (n_embd_gqa, n_embd)
        yield f"blk.{i}.attn_v.weight", (n_embd_gqa, n_embd)
        yield f"blk.{i}.attn_output.weight", (n_embd, n_embd)
        yield f"blk.{i}.ffn_norm.weight", (n_embd,)
        yield f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)
        yield f"blk.{i}.ffn_up.weight", (n_ff, n_embd)
        yield f"blk.{i}.ffn_down.weight", (n_embd, n_ff)
    yield "output_norm.weight", (n_embd,)
    yield "output.weight", (n_vocab, n_embd)


def _weights(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: Dtype
) -> np.ndarray[Any, Any]:
    if len(shape) == 1:  # RMS norm weights: ones, F32 as llama.cpp expects for 1-D tensors
        return np.ones(shape, dtype=np.float32)
    # A small spread keeps activations finite through the layers, also in F16.
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    return values.astype(_NP_DTYPE[dtype])


_Value = tuple[Any, "gguf.GGUFValueType", "gguf.GGUFValueType | None"]


def _read_tokenizer(vocab_path: Path) -> dict[str, _Value]:
    reader = gguf.GGUFReader(str(vocab_path))
    out: dict[str, _Value] = {}
    for key in TOKENIZER_KEYS:
        field = reader.get_field(key)
        if field is None:
            continue  # e.g. an older vocab without tokenizer.ggml.pre
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        out[key] = (field.contents(), field.types[0], sub_type)
    if "tokenizer.ggml.tokens" not in out:
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return out


def _fake_tokenizer() -> dict[str, _Value]:
    t = gguf.GGUFValueType
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = [f"\u2581w{i}" for i in range(FAKE_VOCAB_SIZE - 3 - len(bytes_))]
    tokens = ["<unk>", "<s>", "</s>", *bytes_, *pieces]
    token_types = (
        [2, 3, 3] + [6] * len(bytes_) + [1] * len(pieces)
    )  # unknown, control, byte, normal
    return {
        "tokenizer.ggml.model": ("llama", t.STRING, None),
        "tokenizer.ggml.pre": ("default", t.STRING, None),
        "tokenizer.ggml.tokens": (tokens, t.ARRAY, t.STRING),
        "tokenizer.ggml.scores": ([-float(i) for i in range(len(tokens))], t.ARRAY, t.FLOAT32),
        "tokenizer.ggml.token_type": (token_types, t.ARRAY, t.INT32),
        "tokenizer.ggml.bos_token_id": (1, t.UINT32, None),
        "tokenizer.ggml.eos_token_id": (2, t.UINT32, None),
        "tokenizer.ggml.unknown_token_id": (0, t.UINT32, None),
        "tokenizer.ggml.add_bos_token": (True, t.BOOL, None),
        "tokenizer.ggml.add_eos_token": (False, t.BOOL, None),
    }
