"""GGUF inspection and the memory estimate (routerpanel.router.gguf), on small generated files.

The files come from tests.support.ggufgen with its fake tokenizer, so no vocab file is needed;
the llama tier checks the same facts against the real llama-server with the real SPM tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from routerpanel.router.gguf import (
    MIB,
    RUNTIME_OVERHEAD,
    GgufError,
    GgufFacts,
    estimate_memory,
    inspect,
)
from tests.support.ggufgen import FAKE_VOCAB_SIZE, write_tiny_llama


def write(path: Path, **kwargs: object) -> Path:
    args: dict[str, object] = {
        "n_embd": 32,
        "n_layer": 3,
        "n_head": 4,
        "n_ff": 64,
        "ctx": 256,
        "vocab_path": None,
        "seed": 7,
        "dtype": "f32",
    }
    args.update(kwargs)
    return write_tiny_llama(path, **args)  # type: ignore[arg-type]


@pytest.fixture
def gqa_model(tmp_path: Path) -> Path:
    return write(tmp_path / "gqa.gguf", n_head_kv=2, dtype="f16", name="gqa test")


def facts_for(**fields: object) -> GgufFacts:
    base: dict[str, object] = {
        "path": Path("x.gguf"),
        "file_size": 1000 * MIB,
        "architecture": "llama",
        "name": None,
        "parameter_count": 0,
        "file_type": 15,
        "quantisation": "MOSTLY_Q4_K_M",
        "dominant_tensor_type": "Q4_K",
        "tensor_types": {},
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "embedding_length": 4096,
        "feed_forward_length": 14336,
        "key_length": 128,
        "value_length": 128,
        "context_length": 8192,
        "vocab_size": 128256,
    }
    base.update(fields)
    return GgufFacts(**base)  # type: ignore[arg-type]


class TestInspect:
    def test_it_reads_the_architecture_and_dimensions(self, gqa_model: Path) -> None:
        facts = inspect(gqa_model)
        assert facts.architecture == "llama"
        assert facts.name == "gqa test"
        assert (facts.layers, facts.heads, facts.kv_heads) == (3, 4, 2)
        assert facts.embedding_length == 32
        assert facts.feed_forward_length == 64
        assert facts.context_length == 256
        assert facts.vocab_size == FAKE_VOCAB_SIZE
        assert (facts.key_length, facts.value_length) == (8, 8)
        assert (facts.n_embd_k_gqa, facts.n_embd_v_gqa) == (16, 16)
        assert facts.file_size == gqa_model.stat().st_size

    def test_it_counts_every_tensor_element_as_a_parameter(self, gqa_model: Path) -> None:
        v, e, ff, kv = FAKE_VOCAB_SIZE, 32, 64, 16
        per_layer = 2 * e + e * e + 2 * kv * e + e * e + 3 * ff * e
        assert inspect(gqa_model).parameter_count == 2 * v * e + e + 3 * per_layer

    def test_it_names_the_file_type_and_the_dominant_tensor_type(self, gqa_model: Path) -> None:
        facts = inspect(gqa_model)
        assert facts.file_type == 1
        assert facts.quantisation == "MOSTLY_F16"
        assert facts.dominant_tensor_type == "F16"
        assert facts.tensor_types["F32"] == 32 * (1 + 2 * 3)  # the norms stay F32

    def test_an_all_f32_model_says_so(self, tmp_path: Path) -> None:
        facts = inspect(write(tmp_path / "f32.gguf", dtype="f32"))
        assert (facts.quantisation, facts.dominant_tensor_type) == ("ALL_F32", "F32")
        assert set(facts.tensor_types) == {"F32"}

    def test_the_same_seed_writes_the_same_bytes(self, tmp_path: Path) -> None:
        a = write(tmp_path / "a.gguf", seed=3).read_bytes()
        assert write(tmp_path / "b.gguf", seed=3).read_bytes() == a
        assert write(tmp_path / "c.gguf", seed=4).read_bytes() != a


class TestUnreadableFiles:
    def test_a_missing_file_is_a_gguf_error(self, tmp_path: Path) -> None:
        with pytest.raises(GgufError, match="no such file"):
            inspect(tmp_path / "nope.gguf")

    def test_a_directory_is_a_gguf_error(self, tmp_path: Path) -> None:
        with pytest.raises(GgufError, match="is a directory"):
            inspect(tmp_path)

    def test_an_empty_file_is_a_gguf_error(self, tmp_path: Path) -> None:
        (tmp_path / "empty.gguf").write_bytes(b"")
        with pytest.raises(GgufError, match="empty file"):
            inspect(tmp_path / "empty.gguf")

    def test_a_text_file_is_not_a_gguf(self, tmp_path: Path) -> None:
        (tmp_path / "notes.gguf").write_text("[model]\nctx-size = 4096\n")
        with pytest.raises(GgufError, match=r"not a GGUF file \(starts with b'\[mod'"):
            inspect(tmp_path / "notes.gguf")

    @pytest.mark.parametrize("keep", [0.002, 0.3, 0.6, 0.95, 0.9999])
    def test_a_truncated_file_is_a_gguf_error(self, gqa_model: Path, keep: float) -> None:
        data = gqa_model.read_bytes()
        gqa_model.write_bytes(data[: max(8, int(len(data) * keep))])
        with pytest.raises(GgufError, match=r"gqa\.gguf: (malformed|truncated)"):
            inspect(gqa_model)

    def test_a_gguf_without_an_architecture_is_a_gguf_error(self, tmp_path: Path) -> None:
        # A header with no keys and no tensors: magic, version 3, 0 tensors, 0 keys.
        path = tmp_path / "bare.gguf"
        path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
        with pytest.raises(GgufError, match=r"no general\.architecture"):
            inspect(path)


class TestEstimateMemory:
    def test_it_adds_weights_kv_cache_compute_output_and_runtime(self) -> None:
        est = estimate_memory(facts_for(), 8192)
        assert est.weights == 1000 * MIB
        # 8192 cells × 32 layers × (128 × 8 for K + 128 × 8 for V) × 2 bytes = 1 GiB
        assert est.kv_cache == 8192 * 32 * 2048 * 2 == 1024 * MIB
        assert est.compute == 512 * 4 * (3 * 14336 + 4 * 4096)
        assert est.output == 128256 * 4
        assert est.runtime == RUNTIME_OVERHEAD
        assert est.overhead == est.compute + est.output + est.runtime
        assert est.total == est.weights + est.kv_cache + est.overhead

    def test_the_kv_cache_scales_with_context_and_cache_type_but_not_with_slots(self) -> None:
        facts = facts_for()
        base = estimate_memory(facts, 4096)
        assert estimate_memory(facts, 8192).kv_cache == 2 * base.kv_cache
        assert estimate_memory(facts, 4096, kv_type_bytes=1).kv_cache == base.kv_cache // 2
        four = estimate_memory(facts, 4096, n_parallel=4)
        assert four.kv_cache == base.kv_cache
        assert four.output == 4 * base.output

    def test_context_zero_means_the_trained_context(self) -> None:
        est = estimate_memory(facts_for(context_length=2048), 0)
        assert est.n_ctx == 2048
        assert est.kv_cache == estimate_memory(facts_for(), 2048).kv_cache

    def test_missing_metadata_counts_as_zero(self) -> None:
        facts = facts_for(layers=None, kv_heads=None, feed_forward_length=None, vocab_size=None)
        est = estimate_memory(facts, 4096)
        assert (est.kv_cache, est.output) == (0, 0)
        assert est.compute == 512 * 4 * 4 * 4096
        assert est.total == est.weights + est.compute + RUNTIME_OVERHEAD

    def test_it_works_on_inspected_facts(self, gqa_model: Path) -> None:
        est = estimate_memory(inspect(gqa_model), 256)
        assert est.weights == gqa_model.stat().st_size
        assert est.kv_cache == 256 * 3 * (16 + 16) * 2

    @pytest.mark.parametrize(
        "kwargs", [{"n_ctx": -1}, {"n_parallel": 0}, {"kv_type_bytes": 0}, {"n_ubatch": 0}]
    )
    def test_it_rejects_nonsense_arguments(self, kwargs: dict[str, int]) -> None:
        args = {"n_ctx": 512, **kwargs}
        n_ctx = args.pop("n_ctx")
        with pytest.raises(ValueError):
            estimate_memory(facts_for(), n_ctx, **args)
